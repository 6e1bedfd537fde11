//! The emulation harnesses' stdin: little-endian words after an 8-byte magic.

/// Little-endian harness input.
#[derive(Default)]
pub struct Input(pub Vec<u8>);

impl Input {
    pub fn new(magic: &[u8; 8]) -> Self {
        Self(magic.to_vec())
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend(v.to_le_bytes());
        self
    }
    pub fn f32(&mut self, v: f32) -> &mut Self {
        self.0.extend(v.to_le_bytes());
        self
    }
    pub fn f32s(&mut self, v: &[f32]) -> &mut Self {
        for x in v {
            self.0.extend(x.to_le_bytes());
        }
        self
    }
}
