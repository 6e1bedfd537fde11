//! Inputs of the grouped expert matmul (`AffineTensor::grouped_matmul_t`).

/// The row offsets of experts holding `counts[e]` rows each, in expert order: `experts + 1`
/// entries from 0.
pub fn row_offsets(counts: &[usize]) -> Vec<u32> {
    std::iter::once(0)
        .chain(counts.iter().scan(0u32, |at, &c| {
            *at += c as u32;
            Some(*at)
        }))
        .collect()
}
