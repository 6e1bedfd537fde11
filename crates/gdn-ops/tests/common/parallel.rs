//! Running the cases of a test on two threads (the machines that run these have few cores).

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
    assert!(
        failures.is_empty(),
        "{} of {cases} {what}:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
