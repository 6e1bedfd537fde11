//! Value parsers for numeric flags: each says which range is allowed (the server checks JSON
//! fields against the same ranges).

pub fn parse_f32(s: &str) -> Result<f32, String> {
    s.parse::<f32>()
        .ok()
        .filter(|x| x.is_finite())
        .ok_or_else(|| "expected a number".into())
}

pub fn non_negative(s: &str) -> Result<f32, String> {
    parse_f32(s).and_then(|x| {
        if x >= 0.0 {
            Ok(x)
        } else {
            Err("must be 0 or more".into())
        }
    })
}

pub fn positive(s: &str) -> Result<f32, String> {
    parse_f32(s).and_then(|x| {
        if x > 0.0 {
            Ok(x)
        } else {
            Err("must be more than 0".into())
        }
    })
}

pub fn probability(s: &str) -> Result<f32, String> {
    parse_f32(s).and_then(|x| {
        if (0.0..=1.0).contains(&x) {
            Ok(x)
        } else {
            Err("must be between 0 and 1".into())
        }
    })
}

pub fn probability_above_zero(s: &str) -> Result<f32, String> {
    probability(s).and_then(|x| {
        if x > 0.0 {
            Ok(x)
        } else {
            Err("must be more than 0 and at most 1".into())
        }
    })
}

/// OpenAI's range for `presence_penalty` and `frequency_penalty`.
pub fn penalty(s: &str) -> Result<f32, String> {
    parse_f32(s).and_then(|x| {
        if (-2.0..=2.0).contains(&x) {
            Ok(x)
        } else {
            Err("must be between -2 and 2".into())
        }
    })
}
