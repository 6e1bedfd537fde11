use super::Inputs;

pub fn run(_: &Inputs) {}
