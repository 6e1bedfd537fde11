mod cpu;

pub struct Inputs;

pub fn run(x: &Inputs) {
    cpu::run(x)
}
