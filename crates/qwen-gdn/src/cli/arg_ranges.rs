//! Value parsers for numeric flags: each says which range is allowed (the server checks JSON
//! fields against the same ranges).

pub fn parse_f32(s: &str) -> Result<f32, String> {
    s.parse::<f32>()
        .ok()
        .filter(|x| x.is_finite())
        .ok_or_else(|| "expected a number".into())
}

/// `s` as a number that `allowed` accepts; `why` when it does not.
fn within(s: &str, allowed: impl Fn(f32) -> bool, why: &str) -> Result<f32, String> {
    let x = parse_f32(s)?;
    if allowed(x) {
        Ok(x)
    } else {
        Err(why.into())
    }
}

pub fn non_negative(s: &str) -> Result<f32, String> {
    within(s, |x| x >= 0.0, "must be 0 or more")
}

pub fn positive(s: &str) -> Result<f32, String> {
    within(s, |x| x > 0.0, "must be more than 0")
}

pub fn probability(s: &str) -> Result<f32, String> {
    within(s, |x| (0.0..=1.0).contains(&x), "must be between 0 and 1")
}

pub fn probability_above_zero(s: &str) -> Result<f32, String> {
    probability(s)?;
    within(s, |x| x > 0.0, "must be more than 0 and at most 1")
}

/// OpenAI's range for `presence_penalty` and `frequency_penalty`.
pub fn penalty(s: &str) -> Result<f32, String> {
    within(s, |x| (-2.0..=2.0).contains(&x), "must be between -2 and 2")
}
