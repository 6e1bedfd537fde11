use crate::b::B;

pub struct A(pub B);

pub fn g() -> &'static str {
    // crate::c::C in a comment is not an import,
    "nor is crate::c::C { } in a string"
}

#[cfg(test)]
mod tests {
    use super::*;
}
