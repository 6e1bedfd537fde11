pub struct E;

pub fn h(d: &crate::d::D) -> &E {
    &d.1
}
