//! What a line typed into `qwen-gdn chat` asks for: a message to the model, or a `/command`.

use std::path::PathBuf;

/// The commands, as `/help` lists them.
pub const HELP: &str = "\
/reset        forget the conversation (the system prompt stays)
/save <file>  write the conversation as a JSON list of messages (never over an existing file)
/exit         leave (as do Ctrl-D and, at the prompt, Ctrl-C)
/help         this list
A message that starts with `/` is sent by doubling it: `//etc/hosts?` sends `/etc/hosts?`.";

#[derive(Debug, PartialEq, Eq)]
pub enum Input {
    /// Text for the model.
    Message(String),
    Reset,
    Exit,
    Save(PathBuf),
    Help,
    /// Nothing to do (a blank line).
    Nothing,
}

/// Reads one line. A bad command is an error message of one line; the session goes on.
pub fn parse(line: &str) -> Result<Input, String> {
    let line = line.trim_end_matches(['\r', '\n']);
    if line.trim().is_empty() {
        return Ok(Input::Nothing);
    }
    let Some(command) = line.trim_start().strip_prefix('/') else {
        return Ok(Input::Message(line.to_string()));
    };
    if command.starts_with('/') {
        return Ok(Input::Message(line.trim_start()[1..].to_string()));
    }
    let (name, rest) = command
        .split_once(char::is_whitespace)
        .map_or((command, ""), |(n, r)| (n, r.trim()));
    let no_argument = |input: Input| {
        if rest.is_empty() {
            Ok(input)
        } else {
            Err(format!("/{name} takes no argument"))
        }
    };
    match name {
        "reset" => no_argument(Input::Reset),
        "exit" | "quit" => no_argument(Input::Exit),
        "help" => no_argument(Input::Help),
        "save" if rest.is_empty() => Err("/save needs a file name: /save <file>".into()),
        "save" => Ok(Input::Save(PathBuf::from(rest))),
        _ => Err(format!(
            "unknown command /{name}; /help lists the commands (a message starting with / is \
             sent as //...)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_commands_and_mistakes() {
        assert_eq!(parse("hello\n"), Ok(Input::Message("hello".into())));
        assert_eq!(
            parse("  two words "),
            Ok(Input::Message("  two words ".into()))
        );
        assert_eq!(parse("   \r\n"), Ok(Input::Nothing));
        assert_eq!(parse("/reset"), Ok(Input::Reset));
        assert_eq!(parse(" /exit "), Ok(Input::Exit));
        assert_eq!(parse("/quit"), Ok(Input::Exit));
        assert_eq!(parse("/help"), Ok(Input::Help));
        assert_eq!(
            parse("/save  my chat.json "),
            Ok(Input::Save("my chat.json".into()))
        );
        assert_eq!(
            parse("//etc/hosts?"),
            Ok(Input::Message("/etc/hosts?".into()))
        );
        for bad in ["/save", "/reset now", "/frobnicate", "/"] {
            let err = parse(bad).unwrap_err();
            assert!(!err.contains('\n') && !err.is_empty(), "{bad}: {err}");
        }
        assert!(parse("/frobnicate").unwrap_err().contains("/frobnicate"));
    }
}
