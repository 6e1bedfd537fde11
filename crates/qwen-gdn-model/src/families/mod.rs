//! Model families: each folder holds what only its family uses (its layers' wiring, its own
//! layers and state); the building blocks they share are in [`crate::layers`].

pub mod qwen4_exp;
