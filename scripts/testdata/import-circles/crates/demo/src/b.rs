pub struct B;

pub fn f() -> &'static str {
    super::a::g()
}
