use crate::{
    c::C,
    e::{self, E},
};

pub struct D(pub C, pub E);
