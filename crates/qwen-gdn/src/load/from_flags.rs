//! [`ModelArgs`] for a library user, from the same flags the command line takes, so that every
//! flag keeps its default and its check (`--prefill-chunk-size 0` is refused here too).

use super::ModelArgs;
use anyhow::{anyhow, Result};
use std::ffi::OsString;

#[derive(clap::Parser)]
#[command(name = "qwen-gdn")]
struct Flags {
    #[command(flatten)]
    model: ModelArgs,
}

impl ModelArgs {
    /// `ModelArgs::from_flags(["--model", "models/qwen3.5-tiny-4bit", "--device", "cpu"])`.
    /// A bad flag is an error of one line that names it, as on the command line.
    pub fn from_flags<I, S>(flags: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        let argv =
            std::iter::once(OsString::from("qwen-gdn")).chain(flags.into_iter().map(Into::into));
        let flags = <Flags as clap::Parser>::try_parse_from(argv).map_err(|e| {
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or_default();
            anyhow!("{}", first.trim_start_matches("error: "))
        })?;
        Ok(flags.model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::DeviceChoice;

    #[test]
    fn flags_keep_their_defaults_and_checks() {
        let args = ModelArgs::from_flags(["--model", "m", "--device", "cpu"]).unwrap();
        assert_eq!(args.model, "m");
        assert_eq!(args.prefill_chunk_size, 2048);
        assert!(args.device == DeviceChoice::Cpu);
        let refused = |flags: &[&str]| match ModelArgs::from_flags(flags) {
            Ok(_) => panic!("{flags:?} was taken"),
            Err(e) => e,
        };
        let e = refused(&["--model", "m", "--prefill-chunk-size", "0"]);
        assert_eq!(
            e.to_string(),
            "invalid value '0' for '--prefill-chunk-size <N>': expected a whole number of at least 1"
        );
        let e = refused(&["--model", "m", "--temp", "0"]);
        assert_eq!(e.to_string(), "unexpected argument '--temp' found");
    }
}
