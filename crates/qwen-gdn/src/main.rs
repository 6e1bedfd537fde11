//! `qwen-gdn`: run Qwen3-Next / Qwen3.5 hybrid models from a local folder or the Hugging Face
//! Hub. Everything is in the library (`src/lib.rs`); the command line is `qwen_gdn::cli`.

fn main() -> std::process::ExitCode {
    qwen_gdn::cli::main()
}
