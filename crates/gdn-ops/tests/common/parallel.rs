//! Running the cases of a test on two threads (the machines that run these have few cores), or,
//! for the emulation tests' slow harness runs, on every core.

/// `check` on every case, the cases split between two threads: the failures, in case order.
pub fn failures<C: Sync>(cases: &[C], check: impl Fn(&C) -> Option<String> + Sync) -> Vec<String> {
    let check = &check;
    std::thread::scope(|s| {
        let handles: Vec<_> = cases
            .chunks(cases.len().div_ceil(2).max(1))
            .map(|chunk| s.spawn(move || chunk.iter().filter_map(check).collect::<Vec<_>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    })
}

/// Fails the test when any of `cases` cases failed: "N of M `what`:", then the failures, one
/// a line.
pub fn assert_no_failures(failures: &[String], cases: usize, what: &str) {
    assert_none_failed(failures.len(), cases, what, failures);
}

/// Fails the test when `failed` of `cases` cases failed: "N of M `what`:", then `report` (the
/// failures, or a summary of them), one a line.
pub fn assert_none_failed(failed: usize, cases: usize, what: &str, report: &[String]) {
    assert!(
        failed == 0,
        "{failed} of {cases} {what}:\n{}",
        report.join("\n")
    );
}

/// `check` on every case, on up to eight threads that take the next case as they finish one:
/// the failures as `(case index, description)`, in case order.
pub fn failures_on_all_cores<C: Sync>(
    cases: &[C],
    check: impl Fn(&C) -> Option<String> + Sync,
) -> Vec<(usize, String)> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(vec![]);
    let workers = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .min(8);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(c) = cases.get(i) else {
                    break;
                };
                if let Some(bad) = check(c) {
                    failures.lock().unwrap().push((i, bad));
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap();
    failures.sort();
    failures
}
