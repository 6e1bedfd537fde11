//! qwen4_exp's per-layer gates on transformers' own inputs, the same for both fixtures: the
//! raw HF layout (tests/qwen4_exp.rs) and the mlx-vlm 4-bit layout (tests/qwen4_exp_mlx.rs).
//! Each fixture's test names what its layout adds.

/// One test per gate of [`Fixture`] on the fixture `name`: `test => gate` makes
/// `#[test] fn test() { Fixture::open(name).gate() }`, with the doc comments given.
#[allow(unused_macros)] // for the two qwen4_exp tests
macro_rules! layer_gates {
    ($name:expr; $($(#[$doc:meta])* $test:ident => $gate:ident,)*) => {
        $($(#[$doc])*
        #[test]
        fn $test() {
            crate::common::qwen4_exp::Fixture::open($name).$gate();
        })*
    };
}
#[allow(unused_imports)]
pub(crate) use layer_gates;

use super::{models_dir, rel_max_diff, Reference};
use candle_core::{DType, Device, Tensor};
use qwen_gdn_model::cache::{GdnCache, KvCache};
use qwen_gdn_model::config::LayerKind;
use qwen_gdn_model::families::qwen4_exp::hyper_connection::HyperConnection;
use qwen_gdn_model::families::qwen4_exp::ple::PerLayerEmbedding;
use qwen_gdn_model::families::qwen4_exp::qsa_indexer::{IndexerCache, QsaIndexer};
use qwen_gdn_model::families::qwen4_exp::{ngram_tables, output_gate};
use qwen_gdn_model::layers::attention::Attention;
use qwen_gdn_model::layers::gdn::GatedDeltaNet;
use qwen_gdn_model::layers::linear::Linear;
use qwen_gdn_model::layers::moe::SparseMoe;
use qwen_gdn_model::weights::Checkpoint;
use qwen_gdn_model::Config;

/// A fixture's config, checkpoint and transformers reference.
pub struct Fixture {
    pub cfg: Config,
    pub ckpt: Checkpoint,
    pub r: Reference,
}

impl Fixture {
    pub fn open(name: &str) -> Self {
        let dir = models_dir().join(name);
        let cfg = Config::from_dir(&dir).unwrap();
        let ckpt = Checkpoint::open(&dir, &cfg).unwrap();
        Self {
            cfg,
            ckpt,
            r: Reference::load(name),
        }
    }

    /// `got` within `tol` of max |reference `key`|.
    fn close(&self, got: &Tensor, key: &str, tol: f32) {
        let d = rel_max_diff(got, self.r.get(key));
        assert!(d <= tol, "{key}: {d:e} relative to max|ref|");
    }

    /// Both PLE blocks on transformers' input streams, over the whole prompt and in chunks
    /// (the carried n-gram context and conv window), against transformers' PLE term.
    pub fn per_layer_embeddings_match(&self) {
        let (cfg, ckpt, r) = (&self.cfg, &self.ckpt, &self.r);
        let tokens = r.ids("tf_ids");
        for table in ngram_tables::locate(ckpt, cfg).unwrap() {
            let i = table.layer;
            let ple = PerLayerEmbedding::load(ckpt, &table, cfg).unwrap();
            let hs = r.get(&format!("tf_hidden.{}", i - 1));
            let want = r.get(&format!("tf_ple.{i}"));
            let mut state = ple.new_state().unwrap();
            let whole = ple.forward(hs, &tokens, &mut state).unwrap();
            let d = rel_max_diff(&whole, want);
            assert!(d <= 1e-5, "tf_ple.{i}: {d:e}");
            let mut state = ple.new_state().unwrap();
            let mut parts = vec![];
            for (a, b) in [(0, 7), (7, 8), (8, 41), (41, tokens.len())] {
                let chunk = hs.narrow(0, a, b - a).unwrap();
                parts.push(ple.forward(&chunk, &tokens[a..b], &mut state).unwrap());
            }
            let d = rel_max_diff(&Tensor::cat(&parts, 0).unwrap(), want);
            assert!(d <= 1e-5, "tf_ple.{i} in chunks: {d:e}");
        }
    }

    /// Every hyper-connection, fed transformers' own inputs: the mixed inputs and gates of
    /// each layer, the residual updates that rebuild each layer's output from its mixer and
    /// MoE outputs (each layer from transformers' stream, so that errors do not accumulate),
    /// and the final mixer + lm_head against the logits.
    pub fn hyper_connections_and_lm_head_match(&self) {
        let (cfg, ckpt, r) = (&self.cfg, &self.ckpt, &self.r);
        for i in 0..cfg.num_hidden_layers {
            let before = match i {
                0 => "tf_embed".to_string(),
                _ => format!("tf_hidden.{}", i - 1),
            };
            let mut hs = r.get(&before).clone();
            if r.0.contains_key(&format!("tf_ple.{i}")) {
                hs = (hs + r.get(&format!("tf_ple.{i}"))).unwrap();
            }
            for (which, out) in [("attn", "tf_mixer"), ("mlp", "tf_mlp")] {
                let name = format!("model.layers.{i}.{which}_hyper_connection");
                let hc = HyperConnection::load(ckpt, &name, cfg, true).unwrap();
                let (x, w) = hc.forward(&hs).unwrap();
                let w = w.unwrap();
                self.close(&x, &format!("tf_{which}_hc.{i}.x"), 1e-5);
                self.close(&w, &format!("tf_{which}_hc.{i}.w"), 1e-5);
                hs = HyperConnection::inject(&hs, r.get(&format!("{out}.{i}")), &w).unwrap();
            }
            self.close(&hs, &format!("tf_hidden.{i}"), 1e-5);
        }
        let mixer =
            HyperConnection::load(ckpt, "model.hyper_connection_mixer", cfg, false).unwrap();
        let last = format!("tf_hidden.{}", cfg.num_hidden_layers - 1);
        let (x, w) = mixer.forward(r.get(&last)).unwrap();
        assert!(w.is_none());
        self.close(&x, "tf_final_mixed", 1e-5);
        let head = Linear::load(ckpt, "lm_head", cfg.vocab_size, cfg.hidden_size, cfg).unwrap();
        let logits = head.forward(r.get("tf_final_mixed")).unwrap();
        self.close(&logits, "tf_logits", 1e-5);
    }

    /// The GDN mixers (with the sigmoid output gate) on transformers' inputs.
    pub fn gdn_mixers_match(&self) {
        let (cfg, ckpt, r) = (&self.cfg, &self.ckpt, &self.r);
        let linear = |&i: &usize| cfg.layer_kind(i) == LayerKind::LinearAttention;
        for i in (0..cfg.num_hidden_layers).filter(linear) {
            let name = format!("model.layers.{i}.linear_attn");
            let gdn = GatedDeltaNet::load(ckpt, &name, cfg, output_gate(cfg)).unwrap();
            let x = r.get(&format!("tf_attn_hc.{i}.x")).unsqueeze(0).unwrap();
            let mut cache = GdnCache::default();
            let y = gdn.forward(&x, &mut cache).unwrap().squeeze(0).unwrap();
            let d = rel_max_diff(&y, r.get(&format!("tf_mixer.{i}")));
            assert!(d <= 1e-4, "tf_mixer.{i}: {d:e}");
        }
    }

    /// The MoE blocks on transformers' inputs.
    pub fn moe_blocks_match(&self) {
        let (cfg, ckpt, r) = (&self.cfg, &self.ckpt, &self.r);
        for i in 0..cfg.num_hidden_layers {
            let moe = SparseMoe::load(ckpt, &format!("model.layers.{i}.mlp"), cfg).unwrap();
            let x = r.get(&format!("tf_mlp_hc.{i}.x")).unsqueeze(0).unwrap();
            let y = moe.forward(&x).unwrap().squeeze(0).unwrap();
            let d = rel_max_diff(&y, r.get(&format!("tf_mlp.{i}")));
            assert!(d <= 1e-5, "tf_mlp.{i}: {d:e}");
        }
    }

    /// The QSA attention layer (layer 2) on transformers' input: the indexer's token selection
    /// for every query, the attention output over the whole prompt, and the same output from a
    /// 5-token prefill followed by one token per call. Returns the selection.
    pub fn qsa_attention_matches(&self) -> Vec<Vec<bool>> {
        let (cfg, ckpt, r) = (&self.cfg, &self.ckpt, &self.r);
        let i = 2;
        let p = format!("model.layers.{i}.self_attn");
        let attn = Attention::load(ckpt, &p, cfg).unwrap();
        let indexer = QsaIndexer::load(ckpt, &p, cfg).unwrap();
        let x = r.get(&format!("tf_attn_hc.{i}.x"));
        let n = x.dim(0).unwrap();
        let visible = indexer.select(x, &mut IndexerCache::default(), 0).unwrap();
        let want = r
            .get(&format!("qsa_selected.{i}"))
            .to_vec2::<i32>()
            .unwrap();
        for (t, (got, want)) in visible.iter().zip(&want).enumerate() {
            let want: Vec<bool> = want.iter().map(|&v| v != 0).collect();
            assert_eq!(got, &want, "query {t}: selected keys differ");
        }
        let mask = QsaIndexer::mask(&visible).unwrap();
        let mut kv = KvCache::default();
        let y = attn
            .forward_masked(&x.unsqueeze(0).unwrap(), &mut kv, 0, Some(&mask))
            .unwrap()
            .squeeze(0)
            .unwrap();
        self.close(&y, &format!("tf_mixer.{i}"), 1e-5);

        let (mut icache, mut kv, mut outs) = (IndexerCache::default(), KvCache::default(), vec![]);
        let mut offset = 0;
        for len in std::iter::once(5).chain(std::iter::repeat_n(1, n - 5)) {
            let xs = x.narrow(0, offset, len).unwrap();
            let visible = indexer.select(&xs, &mut icache, offset).unwrap();
            let mask = QsaIndexer::mask(&visible).unwrap();
            let y = attn
                .forward_masked(&xs.unsqueeze(0).unwrap(), &mut kv, offset, Some(&mask))
                .unwrap();
            outs.push(y.squeeze(0).unwrap());
            offset += len;
        }
        let d = rel_max_diff(
            &Tensor::cat(&outs, 0).unwrap(),
            r.get(&format!("tf_mixer.{i}")),
        );
        assert!(d <= 1e-5, "tf_mixer.{i} step by step: {d:e}");
        visible
    }

    /// The fused decode step's selection on the device (`QsaIndexer::select_on_device`, the
    /// keys kept there) on transformers' inputs to the QSA layer: a 5-token prefill selected
    /// on the host, then one token a call on the device, every query's mask equal to
    /// transformers' recorded selection, with nothing read back; then the last 10 queries as
    /// a prompt chunk selected on the host from the keys read back. Returns how many
    /// device-selected queries dropped keys.
    pub fn qsa_device_selection_matches(&self) -> usize {
        let (cfg, ckpt, r) = (&self.cfg, &self.ckpt, &self.r);
        let i = 2;
        let p = format!("model.layers.{i}.self_attn");
        let indexer = QsaIndexer::load(ckpt, &p, cfg)
            .unwrap()
            .into_device(&Device::Cpu, DType::F32)
            .unwrap();
        assert!(indexer.selects_on_device());
        let x = r.get(&format!("tf_attn_hc.{i}.x"));
        let n = x.dim(0).unwrap();
        let want = r
            .get(&format!("qsa_selected.{i}"))
            .to_vec2::<i32>()
            .unwrap();
        let mut keys = IndexerCache::default();
        indexer
            .select(&x.narrow(0, 0, 5).unwrap(), &mut keys, 0)
            .unwrap();
        let mut sparse = 0;
        // The last 10 queries: a prompt chunk after the decode steps, selected on the host
        // from the keys read back.
        let last = n - 10;
        for t in 5..last {
            // The step's inputs are uploaded before the step (a graph's are written then).
            let step = indexer.step_values(t).upload(x.device()).unwrap();
            let before = gdn_ops::launches::read_backs();
            let mask = indexer
                .select_on_device(&x.narrow(0, t, 1).unwrap(), &mut keys, t, &step)
                .unwrap();
            assert_eq!(
                gdn_ops::launches::read_backs(),
                before,
                "query {t}: the device selection read back"
            );
            assert!(keys.device.is_some() && keys.blocks.is_empty());
            let got: Vec<bool> = match mask {
                Some(m) => {
                    assert_eq!(m.dims(), &[1, t + 1]);
                    m.flatten_all()
                        .unwrap()
                        .to_vec1::<f32>()
                        .unwrap()
                        .iter()
                        .map(|&v| {
                            assert!(v == 0.0 || v == f32::NEG_INFINITY, "mask value {v}");
                            v == 0.0
                        })
                        .collect()
                }
                None => vec![true; t + 1],
            };
            let want: Vec<bool> = want[t][..t + 1].iter().map(|&v| v != 0).collect();
            assert_eq!(got, want, "query {t}: selected keys differ");
            sparse += usize::from(got.iter().any(|&o| !o));
        }
        let visible = indexer
            .select(&x.narrow(0, last, n - last).unwrap(), &mut keys, last)
            .unwrap();
        assert!(keys.device.is_none());
        for (t, got) in (last..n).zip(&visible) {
            let want: Vec<bool> = want[t][..n].iter().map(|&v| v != 0).collect();
            assert_eq!(got, &want, "query {t} (host, after the device steps)");
        }
        // The keys equal the host's own run over the same tokens.
        let mut host = IndexerCache::default();
        indexer.select(x, &mut host, 0).unwrap();
        assert_eq!(
            (keys.blocks.len(), keys.tail.len()),
            (host.blocks.len(), host.tail.len())
        );
        for (got, want) in keys
            .blocks
            .iter()
            .chain(&keys.tail)
            .zip(host.blocks.iter().chain(&host.tail))
        {
            let d = got
                .iter()
                .zip(want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(d <= 1e-5, "index keys differ by {d:e}");
        }
        sparse
    }
}
