use crate::{
    c::C,
    e::{self, E as Renamed},
};

pub struct D(pub C, pub Renamed);
