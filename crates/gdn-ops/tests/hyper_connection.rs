//! The CPU twin of the hyper-connection kernels against the composed candle ops they replace
//! in the model (crates/qwen-gdn-model/src/families/qwen4_exp/hyper_connection.rs: the
//! injection `hs + w[s]·y` with `w = 2·sigmoid(g / S)`, the grouped RMSNorm with its `[S, H]`
//! weight, the low-rank activation `silu(d / S)` and the mixing `mean_s sigmoid(u)·n`), over the op's cases
//! (tests/common/hyper_connection.rs), and its input checks; `hc_up_mix` against the three
//! twins it fuses (exactly) and against the composed ops (activation, dense product with the
//! dequantized up matrix, mixing).

mod common;

use candle_core::{DType, Device, Tensor, D};
use common::hyper_connection::{
    inputs, runs, seed, up_mix_inputs, up_mix_runs, up_mix_seed, UpMixCase, FORMS, SLOTS,
};
use common::{max_rel, tensor, values, Ty};
use gdn_ops::ops::affine::AffineTensor;
use gdn_ops::ops::hyper_connection::{
    hc_act, hc_inject_norm, hc_inject_slots_norm, hc_mix, hc_up_mix,
};
use gdn_ops::ops::moe_combine::moe_weighted_sum;

const EPS: f32 = 1e-6;

/// The model's composed injection: `hs + concat_s(w[s] · y)`, `w = 2·sigmoid(g / S)`.
fn composed_inject(hs: &Tensor, y: &Tensor, g: &Tensor, s: usize) -> Tensor {
    let (t, h) = y.dims2().unwrap();
    let w = (candle_nn::ops::sigmoid(&(g / s as f64).unwrap()).unwrap() * 2.0).unwrap();
    let add = y
        .reshape((t, 1, h))
        .unwrap()
        .broadcast_mul(&w.reshape((t, s, 1)).unwrap())
        .unwrap()
        .reshape((t, s * h))
        .unwrap();
    hs.add(&add).unwrap()
}

/// The model's composed grouped RMSNorm (`GroupedRmsNorm::forward`), in f32.
fn composed_norm(x: &Tensor, weight: &Tensor) -> Tensor {
    let (groups, group) = weight.dims2().unwrap();
    let t = x.dim(0).unwrap();
    let xf = x
        .to_dtype(DType::F32)
        .unwrap()
        .reshape((t, groups, group))
        .unwrap();
    let ms = xf.sqr().unwrap().mean_keepdim(D::Minus1).unwrap();
    let inv = (ms + EPS as f64).unwrap().sqrt().unwrap().recip().unwrap();
    let y = xf
        .broadcast_mul(&inv)
        .unwrap()
        .broadcast_mul(weight)
        .unwrap();
    y.reshape((t, groups * group))
        .unwrap()
        .to_dtype(x.dtype())
        .unwrap()
}

/// The model's composed mixing: `mean_s(sigmoid(u) · n)`.
fn composed_mix(up: &Tensor, normed: &Tensor, s: usize) -> Tensor {
    let (t, width) = up.dims2().unwrap();
    let m = candle_nn::ops::sigmoid(up).unwrap();
    m.mul(normed)
        .unwrap()
        .reshape((t, s, width / s))
        .unwrap()
        .mean(D::Minus2)
        .unwrap()
}

/// The largest absolute difference between two tensors' values.
fn apart(a: &Tensor, b: &Tensor) -> f32 {
    (values(a).iter().zip(values(b)))
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

fn compare(i: usize, (n, s, h): (usize, usize, usize), ty: Ty, tol: f32) {
    let x = inputs((n, s, h), ty, seed(i, ty));
    let hs = tensor(&x.hs, &[n, s * h], ty);
    let y = tensor(&x.y, &[n, h], ty);
    let g = tensor(&x.gate, &[n, s], ty);
    let w = Tensor::from_vec(x.weight.clone(), (s, h), &Device::Cpu).unwrap();
    for (inject, norm) in FORMS {
        let label = format!("{ty:?} N={n} S={s} H={h} inject={inject} norm={norm}");
        let (sum, normed) = hc_inject_norm(
            &hs,
            inject.then_some((&y, &g)),
            norm.then_some((&w, EPS)),
            s,
        )
        .unwrap();
        let want_sum = if inject {
            composed_inject(&hs, &y, &g, s)
        } else {
            hs.clone()
        };
        assert_eq!(sum.dims(), [n, s * h], "{label}");
        let err = max_rel(&sum, &want_sum);
        assert!(err <= tol, "{label}: sum off by {err}");
        if !inject {
            assert_eq!(sum.id(), hs.id(), "{label}: without an injection sum is hs");
        }
        match normed {
            Some(normed) => {
                assert!(norm, "{label}: normed without a norm");
                let err = max_rel(&normed, &composed_norm(&sum, &w));
                assert!(err <= tol, "{label}: normed off by {err}");
            }
            None => assert!(!norm, "{label}: no normed"),
        }
    }
    // A MoE block's slots: the same as `moe_weighted_sum` then the injection (exactly), and
    // within `tol` of the composed weighted sum, injection and norm.
    let down = tensor(&x.slot_down, &[n, SLOTS, h], ty);
    let sw = Tensor::from_vec(x.slot_weights.clone(), (n, SLOTS), &Device::Cpu).unwrap();
    for norm in [true, false] {
        let label = format!("{ty:?} N={n} S={s} H={h} slots norm={norm}");
        let norm = norm.then_some((&w, EPS));
        let (sum, normed) = hc_inject_slots_norm(&hs, (&down, &sw, &g), norm, s).unwrap();
        let y = moe_weighted_sum(&down, &sw).unwrap();
        let (two_sum, two_normed) = hc_inject_norm(&hs, Some((&y, &g)), norm, s).unwrap();
        let d = apart(&sum, &two_sum);
        assert!(
            d == 0.0,
            "{label}: {d} from moe_weighted_sum then hc_inject_norm"
        );
        if let (Some(a), Some(b)) = (&normed, &two_normed) {
            let d = apart(a, b);
            assert!(d == 0.0, "{label}: normed {d} from moe_weighted_sum's");
        }
        assert_eq!(normed.is_some(), two_normed.is_some(), "{label}");
        let y = down
            .to_dtype(DType::F32)
            .unwrap()
            .broadcast_mul(&sw.reshape((n, SLOTS, 1)).unwrap())
            .unwrap()
            .sum(1)
            .unwrap()
            .to_dtype(ty.dtype())
            .unwrap();
        let want = composed_inject(&hs, &y, &g, s);
        let err = max_rel(&sum, &want);
        assert!(err <= tol, "{label}: sum off by {err}");
        if let Some(normed) = normed {
            let err = max_rel(&normed, &composed_norm(&want, &w));
            assert!(err <= tol, "{label}: normed off by {err}");
        }
    }
    let up = tensor(&x.up, &[n, s * h], ty);
    let normed = tensor(&x.normed, &[n, s * h], ty);
    let mixed = hc_mix(&up, &normed, s).unwrap();
    assert_eq!(mixed.dims(), [n, h]);
    let err = max_rel(&mixed, &composed_mix(&up, &normed, s));
    assert!(err <= tol, "{ty:?} N={n} S={s} H={h}: mix off by {err}");
    // The model's composed activation: `silu(d / S)`.
    let d = tensor(&x.down, &[n, h], ty);
    let a = hc_act(&d, s).unwrap();
    assert_eq!(a.dims(), [n, h]);
    let want = (&d / s as f64).unwrap().silu().unwrap();
    let err = max_rel(&a, &want);
    assert!(err <= tol, "{ty:?} N={n} S={s} H={h}: act off by {err}");
}

#[test]
fn twin_matches_the_composed_path_in_f32() {
    for (i, shape, ty) in runs(&[Ty::F32]) {
        compare(i, shape, ty, 1e-5);
    }
}

#[test]
fn twin_matches_the_composed_path_in_bf16_and_f16() {
    for (i, shape, ty) in runs(&[Ty::Bf16, Ty::F16]) {
        compare(i, shape, ty, 2e-2);
    }
}

/// `hc_up_mix` on case `c`: equal to `hc_act`, the up product and `hc_mix` one after the
/// other (the twin is their composition), and within `tol` of max |x| of the model's composed
/// ops in f32: `silu(d / S)`, the product with the dequantized matrix, `mean_s sigmoid(u)·n`.
fn compare_up_mix(i: usize, c: UpMixCase, ty: Ty, tol: f32) {
    let (n, s, h, r) = (c.tokens, c.streams, c.cols, c.rank);
    let label = format!("{ty:?} {c:?}");
    let x = up_mix_inputs(&c, ty, up_mix_seed(i, ty));
    let w = AffineTensor::upload(&x.m, &Device::Cpu).unwrap();
    let d = tensor(&x.d, &[n, r], ty);
    let normed = tensor(&x.normed, &[n, s * h], ty);
    let got = hc_up_mix(&d, &w, &normed, s).unwrap();
    assert_eq!(got.dims(), [n, h], "{label}");
    let a = hc_act(&d, s).unwrap().reshape((n, r)).unwrap();
    let three = hc_mix(&w.matmul_t(&a).unwrap(), &normed, s).unwrap();
    let off = apart(&got, &three);
    assert!(off == 0.0, "{label}: {off} from the three kernels' values");
    let dense = w.dequantize(None, s * h, DType::F32).unwrap();
    let a = (d.to_dtype(DType::F32).unwrap() / s as f64)
        .unwrap()
        .silu()
        .unwrap();
    let u = a.matmul(&dense.t().unwrap()).unwrap();
    let f32_normed = normed.to_dtype(DType::F32).unwrap();
    let want = composed_mix(&u, &f32_normed, s);
    let err = max_rel(&got.to_dtype(DType::F32).unwrap(), &want);
    assert!(err <= tol, "{label}: up_mix off by {err}");
}

#[test]
fn up_mix_twin_matches_the_composed_path_in_f32() {
    for (i, c, ty) in up_mix_runs(&[Ty::F32]) {
        compare_up_mix(i, c, ty, 1e-5);
    }
}

#[test]
fn up_mix_twin_matches_the_composed_path_in_bf16_and_f16() {
    for (i, c, ty) in up_mix_runs(&[Ty::Bf16, Ty::F16]) {
        compare_up_mix(i, c, ty, 2e-2);
    }
}

/// A gate logit of 0 injects `y` with weight 1 (`2·sigmoid(0)`), a unit stream normalises to
/// the weight: numbers worked by hand.
#[test]
fn worked_example() {
    let hs = Tensor::new(&[[1f32, 1., 2., 2.]], &Device::Cpu).unwrap();
    let y = Tensor::new(&[[1f32, -1.]], &Device::Cpu).unwrap();
    let g = Tensor::new(&[[0f32, 0.]], &Device::Cpu).unwrap();
    let w = Tensor::new(&[[1f32, 2.], [3., 4.]], &Device::Cpu).unwrap();
    let (sum, normed) = hc_inject_norm(&hs, Some((&y, &g)), Some((&w, 0.0)), 2).unwrap();
    assert_eq!(sum.to_vec2::<f32>().unwrap(), [[2., 0., 3., 1.]]);
    let normed = normed.unwrap().to_vec2::<f32>().unwrap()[0].clone();
    // Stream 0: rms of (2, 0) is √2; stream 1: rms of (3, 1) is √5.
    let want = [
        2. / 2f32.sqrt(),
        0.,
        3. * 3. / 5f32.sqrt(),
        4. / 5f32.sqrt(),
    ];
    for (a, b) in normed.iter().zip(want) {
        assert!((a - b).abs() < 1e-6, "{normed:?} vs {want:?}");
    }
    // sigmoid(0) = 1/2: the mean of half of each stream.
    let up = Tensor::zeros((1, 4), DType::F32, &Device::Cpu).unwrap();
    let x = hc_mix(&up, &hs, 2).unwrap().to_vec2::<f32>().unwrap();
    assert_eq!(x, [[0.75, 0.75]]);
    // silu(0) = 0, silu(2) = 2·sigmoid(2), on d / S with S = 2.
    let d = Tensor::new(&[[0f32, 4.]], &Device::Cpu).unwrap();
    let a = hc_act(&d, 2).unwrap().to_vec2::<f32>().unwrap();
    let want = 2.0 / (1.0 + (-2f32).exp());
    assert!(a[0][0] == 0.0 && (a[0][1] - want).abs() < 1e-6, "{a:?}");
}

#[test]
fn bad_inputs_are_one_line_errors() {
    let hs = Tensor::zeros((1, 8), DType::F32, &Device::Cpu).unwrap();
    let w = Tensor::ones((2, 4), DType::F32, &Device::Cpu).unwrap();
    let err = |r: anyhow::Result<(Tensor, Option<Tensor>)>| format!("{:#}", r.unwrap_err());
    assert!(err(hc_inject_norm(&hs, None, Some((&w, 1e-6)), 3)).contains("not 3 streams"));
    assert!(err(hc_inject_norm(&hs, None, None, 2)).contains("neither"));
    let w16 = w.to_dtype(DType::BF16).unwrap();
    assert!(err(hc_inject_norm(&hs, None, Some((&w16, 1e-6)), 2)).contains("f32"));
    let y = Tensor::zeros((1, 3), DType::F32, &Device::Cpu).unwrap();
    let g = Tensor::zeros((1, 2), DType::F32, &Device::Cpu).unwrap();
    assert!(err(hc_inject_norm(&hs, Some((&y, &g)), None, 2)).contains("y [1, 3]"));
    let n16 = hs.to_dtype(DType::BF16).unwrap();
    let e = format!("{:#}", hc_mix(&hs, &n16, 2).unwrap_err());
    assert!(e.contains("normed") && !e.contains('\n'), "{e}");
    // hc_up_mix: a d of the wrong width, and a 3-bit matrix (outside the kernel).
    let c = common::hyper_connection::up_mix_cases()[1];
    let x = up_mix_inputs(&c, Ty::F32, 1);
    let w = AffineTensor::upload(&x.m, &Device::Cpu).unwrap();
    let normed = Tensor::zeros((1, 4 * 64), DType::F32, &Device::Cpu).unwrap();
    let d = Tensor::zeros((1, 63), DType::F32, &Device::Cpu).unwrap();
    let e = format!("{:#}", hc_up_mix(&d, &w, &normed, 4).unwrap_err());
    assert!(e.contains("d [1, 63]") && !e.contains('\n'), "{e}");
    let mut rng = common::Rng::new(2);
    let m3 = common::scaled_matrix(&mut rng, 3, 32, [1, 256, 64], DType::F32, None);
    let w3 = AffineTensor::upload(&m3, &Device::Cpu).unwrap();
    let d = Tensor::zeros((1, 64), DType::F32, &Device::Cpu).unwrap();
    let e = format!("{:#}", hc_up_mix(&d, &w3, &normed, 4).unwrap_err());
    assert!(e.contains("3-bit") && !e.contains('\n'), "{e}");
}
