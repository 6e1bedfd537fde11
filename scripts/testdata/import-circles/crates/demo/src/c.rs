use crate::A;

pub struct C(pub A);
