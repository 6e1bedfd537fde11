//! From checkpoint files to weight matrices: safetensors mapping and sanitizing
//! ([`checkpoint`]) from the folder's checked files ([`files`]), MLX affine quantization ([`affine`]), and the matrices the CPU
//! kernels consume ([`matrix`]).

pub use gdn_ops::ops::affine;
pub mod checkpoint;
pub mod dense_experts;
pub mod drafter_folder;
pub mod files;
pub mod matrix;
pub mod norm_convention;
mod quantize_on_load;
pub mod random_weights;
pub mod row_exact;
pub mod weight;

pub use affine::AffineMatrix;
pub use checkpoint::Checkpoint;
pub use matrix::{FloatData, FloatMatrix, Matrix, Product};
pub use weight::Weight;
