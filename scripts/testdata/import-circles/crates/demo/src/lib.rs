mod a;
mod b;
mod c;
mod d;
mod e;
pub mod op;

pub use a::A;
