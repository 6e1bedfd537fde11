//! `RunOptions::progress`: the bytes read while a model loads, for the CLI's progress bar.

mod common;

use common::*;
use qwen_gdn_model::{LoadProgress, RunOptions};
use std::sync::{Arc, Mutex};

/// Tensor bytes in the checkpoint's safetensors files, counted from their headers, less the
/// multi-token-prediction and vision tensors that a text model never reads.
fn tensor_bytes(name: &str) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(models_dir().join(name)).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            let data = std::fs::read(&path).unwrap();
            let (_, meta) = safetensors::SafeTensors::read_metadata(&data).unwrap();
            total += meta
                .tensors()
                .iter()
                .filter(|(k, _)| !k.starts_with("mtp.") && !k.contains("visual."))
                .map(|(_, t)| (t.data_offsets.1 - t.data_offsets.0) as u64)
                .sum::<u64>();
        }
    }
    total
}

#[test]
fn loading_reports_every_byte_read() {
    for name in CHECKPOINTS {
        let reports = Arc::new(Mutex::new(Vec::new()));
        let seen = reports.clone();
        let opts = RunOptions {
            progress: Some(LoadProgress::new(move |done, total| {
                seen.lock().unwrap().push((done, total))
            })),
            ..common::run_options()
        };
        load_with(name, &opts);
        let reports = reports.lock().unwrap();
        let total = tensor_bytes(name);
        assert!(reports.len() > 10, "{name}: {} reports", reports.len());
        assert!(
            reports.iter().all(|&(_, t)| t == total),
            "{name}: total is not {total}"
        );
        assert!(
            reports.windows(2).all(|w| w[0].0 <= w[1].0),
            "{name}: the count went back"
        );
        assert_eq!(
            reports.last().unwrap().0,
            total,
            "{name}: not every byte was read"
        );
    }
}
