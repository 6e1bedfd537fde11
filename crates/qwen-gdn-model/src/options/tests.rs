use super::*;
use std::collections::HashMap;

/// The options from exactly these variables.
fn from(vars: &[(&str, &str)]) -> Result<RunOptions> {
    let vars: HashMap<String, OsString> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), OsString::from(v)))
        .collect();
    RunOptions::from_lookup(|name| vars.get(name).cloned())
}

fn error(var: &str, value: &str) -> String {
    format!("{:#}", from(&[(var, value)]).unwrap_err())
}

#[test]
fn nothing_set_is_the_default() {
    let o = from(&[]).unwrap();
    let d = RunOptions::default();
    assert_eq!(o.gdn_prefill, None);
    assert_eq!(o.cpu_level, None);
    assert_eq!(o.q8_layout, Q8Layout::Auto);
    assert_eq!(o.spin, Duration::ZERO);
    assert_eq!(o.gdn_state_dtype, StateDtype::F32);
    assert_eq!(o.conv_front, None);
    assert_eq!(o.attn_prefill, AttnPrefill::Kernel);
    assert_eq!(o.attn_score_bytes, SCORE_BUDGET_BYTES);
    assert_eq!(o.moe_prefill, None);
    assert!(o.cuda_graph);
    assert_eq!(o.moe_combine, CombineKernel::Auto);
    assert_eq!(o.moe_route, RouteKernel::Auto);
    assert_eq!(o.dense_rows, DenseRows::Auto);
    assert_eq!(o.decode_products, DecodeProducts::Auto);
    assert!(o.fused_verify && d.fused_verify);
    assert_eq!(
        (o.verify_window, d.verify_window),
        (VerifyWindow::OneLaunch, VerifyWindow::OneLaunch)
    );
    assert_eq!(
        o.layer_variants(&Device::Cpu),
        d.layer_variants(&Device::Cpu)
    );
    // An empty value is no value.
    let empty: Vec<(&str, &str)> = ENGINE_VARS.iter().map(|v| (*v, "")).collect();
    assert_eq!(
        from(&empty).unwrap().layer_variants(&Device::Cpu),
        d.layer_variants(&Device::Cpu)
    );
}

#[test]
fn every_switch_takes_its_values() {
    // The best level this CPU has: any machine runs the test.
    let best = Level::best();
    let o = from(&[
        (GDN_PREFILL_VAR, "chunked"),
        (CPU_LEVEL_VAR, best.name()),
        (Q8_LAYOUT_VAR, "plain"),
        (SPIN_US_VAR, "1000"),
        (STATE_BF16_VAR, "1"),
        (CONV_FRONT_VAR, "fused"),
        (ATTN_PREFILL_VAR, "composed"),
        (ATTN_SCORE_BYTES_VAR, "4096"),
        (MOE_PREFILL_VAR, "grouped:3"),
        (CUDA_GRAPH_VAR, "0"),
        (MOE_COMBINE_VAR, "one-block"),
        (MOE_ROUTE_VAR, "block"),
        (VERIFY_VAR, "composed"),
        (VERIFY_WINDOW_VAR, "per-token"),
        (DENSE_ROWS_VAR, "rows"),
        (DECODE_PRODUCTS_VAR, "streamed"),
    ])
    .unwrap();
    assert_eq!(o.decode_products, DecodeProducts::Streamed);
    for (name, choice) in DecodeProducts::NAMED {
        assert_eq!(
            from(&[(DECODE_PRODUCTS_VAR, name)])
                .unwrap()
                .decode_products,
            choice
        );
    }
    assert!(!o.fused_verify);
    assert_eq!(o.verify_window, VerifyWindow::PerToken);
    assert_eq!(o.dense_rows, DenseRows::RowProducts);
    for (name, choice) in DenseRows::NAMED {
        assert_eq!(from(&[(DENSE_ROWS_VAR, name)]).unwrap().dense_rows, choice);
    }
    assert_eq!(o.gdn_prefill, Some(GdnForm::Chunked));
    assert_eq!(o.cpu_level, Some(best));
    assert_eq!(o.q8_layout, Q8Layout::Plain);
    assert_eq!(o.spin, Duration::from_micros(1000));
    assert_eq!(o.gdn_state_dtype, StateDtype::Bf16);
    assert_eq!(o.conv_front, Some(ConvFront::Fused));
    assert_eq!(o.attn_prefill, AttnPrefill::Composed);
    assert_eq!(o.attn_score_bytes, 4096);
    assert_eq!(
        o.layer_variants(&Device::Cpu).moe_prefill,
        MoePrefill::Grouped { min_tokens: 3 }
    );
    assert!(!o.cuda_graph);
    assert_eq!(
        o.layer_variants(&Device::Cpu).moe_combine,
        CombineKernel::OneBlock
    );
    assert_eq!(o.layer_variants(&Device::Cpu).moe_route, RouteKernel::Block);
    let o = from(&[
        (GDN_PREFILL_VAR, "recurrent"),
        (CPU_LEVEL_VAR, "portable"),
        (MOE_PREFILL_VAR, "gemm"),
        (CUDA_GRAPH_VAR, "1"),
        (SPIN_US_VAR, "0"),
        (MOE_COMBINE_VAR, "auto"),
        (MOE_ROUTE_VAR, "auto"),
        (VERIFY_VAR, "fused"),
    ])
    .unwrap();
    assert!(o.fused_verify);
    assert_eq!(o.gdn_prefill, Some(GdnForm::Recurrent));
    assert_eq!(o.cpu_level, Some(Level::Portable));
    assert_eq!(from(&[(CPU_LEVEL_VAR, "best")]).unwrap().cpu_level, None);
    let layout = from(&[(Q8_LAYOUT_VAR, "interleaved")]).unwrap().q8_layout;
    assert_eq!(layout, Q8Layout::Interleaved);
    assert_eq!(o.layer_variants(&Device::Cpu).moe_prefill, MoePrefill::Gemm);
    assert!(o.cuda_graph);
    assert_eq!(o.moe_combine, CombineKernel::Auto);
    assert_eq!(o.moe_route, RouteKernel::Auto);
    assert_eq!(
        from(&[(MOE_ROUTE_VAR, "warp")]).unwrap().moe_route,
        RouteKernel::Warp
    );
    assert_eq!(o.spin, Duration::ZERO);
    // `grouped` alone takes the device's threshold.
    let o = from(&[(MOE_PREFILL_VAR, "grouped")]).unwrap();
    assert_eq!(
        o.layer_variants(&Device::Cpu).moe_prefill,
        MoePrefill::grouped_for(&Device::Cpu)
    );
}

#[test]
fn a_bad_value_is_one_line_naming_the_variable_and_the_values() {
    let cases: [(&str, &str, &[&str]); 15] = [
        (GDN_PREFILL_VAR, "chunk", &["recurrent", "chunked"]),
        (
            CPU_LEVEL_VAR,
            "sse",
            &["portable", "avx2", "avx512", "best"],
        ),
        (Q8_LAYOUT_VAR, "packed", &["interleaved", "plain"]),
        (SPIN_US_VAR, "-1", &["whole number"]),
        (CONV_FRONT_VAR, "Fused", &["composed", "fused"]),
        (ATTN_PREFILL_VAR, "flash", &["kernel", "composed"]),
        (ATTN_SCORE_BYTES_VAR, "3", &["whole number ≥ 4"]),
        (MOE_PREFILL_VAR, "grouped:0", &["whole number ≥ 1"]),
        (CUDA_GRAPH_VAR, "off", &["1", "0"]),
        (MOE_COMBINE_VAR, "cluster", &["auto", "one-block"]),
        (MOE_ROUTE_VAR, "threadgroup", &["warp", "block"]),
        (VERIFY_VAR, "on", &["fused", "composed"]),
        (VERIFY_WINDOW_VAR, "batched", &["one-launch", "per-token"]),
        (DECODE_PRODUCTS_VAR, "tensor", &["auto", "streamed"]),
        (
            DENSE_ROWS_VAR,
            "gemm",
            &["auto", "dequantize", "rows", "grouped"],
        ),
    ];
    for (var, value, accepted) in cases {
        let e = error(var, value);
        assert!(
            e.starts_with(&format!("{var}={value}: expected"))
                || e.starts_with(&format!("{var}={value}: the")),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
        for a in accepted {
            assert!(e.contains(a), "{var}: {e} should name {a}");
        }
    }
    assert_eq!(
        error(GDN_PREFILL_VAR, "chunk"),
        "QWEN_GDN_GDN_PREFILL=chunk: expected recurrent or chunked"
    );
    assert_eq!(
        error(CPU_LEVEL_VAR, "sse"),
        "QWEN_GDN_CPU_LEVEL=sse: expected portable, avx2, avx2-vnni, avx512, avx512-vnni, neon, \
         neon-dotprod, neon-i8mm or best"
    );
    // A level of another architecture, and one this CPU lacks, are refused in one line that
    // names what is missing.
    let foreign = if cfg!(target_arch = "aarch64") {
        "avx2"
    } else {
        "neon"
    };
    let e = error(CPU_LEVEL_VAR, foreign);
    assert!(
        e.starts_with(&format!("{CPU_LEVEL_VAR}={foreign}: it needs an ")),
        "{e}"
    );
    for level in Level::ALL.into_iter().filter(|l| !l.supported()) {
        let e = error(CPU_LEVEL_VAR, level.name());
        assert!(
            !e.contains('\n') && (e.contains("lacks") || e.contains("needs")),
            "{e}"
        );
    }
    assert_eq!(
        error(MOE_PREFILL_VAR, "many"),
        "QWEN_GDN_MOE_PREFILL=many: expected pairs, gemm, grouped or grouped:<min tokens>"
    );
    // mlx-lm's switch keeps mlx-lm's rule: only `1` turns it on, nothing is refused.
    for value in ["0", "true", "yes"] {
        let o = from(&[(STATE_BF16_VAR, value)]).unwrap();
        assert_eq!(o.gdn_state_dtype, StateDtype::F32, "{value}");
    }
}

#[test]
fn unknown_qwen_gdn_variables_are_named() {
    let names = [
        "QWEN_GDN_GDN_PREFIL",
        "QWEN_GDN_MOE_PREFILL",
        "QWEN_GDN_API_KEY",
        "QWEN_GDN_TEST_DEVICE",
        "QWEN_GDN_TEST_TOKEN_DELAY_MS",
        "QWEN_GDN_MODELS_DIR",
        "QWEN_GDN_SHARED",
        "QWEN_GDN_TEMPLATE_BYTES",
        "MLX_LM_GDN_STATE_BF16",
        "HOME",
        "QWEN_GDN_CUDA_GRAPHS",
    ];
    let unknown = unknown_vars(names.iter().map(OsString::from));
    assert_eq!(unknown, ["QWEN_GDN_GDN_PREFIL", "QWEN_GDN_CUDA_GRAPHS"]);
}
