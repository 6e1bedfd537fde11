//! Stop strings over streamed text: text is released only once it cannot be the start of a
//! stop string, so the client never sees any part of one.

pub struct StopStrings {
    stops: Vec<String>,
    pending: String,
}

pub enum Step {
    /// Text that is safe to send.
    Emit(String),
    /// A stop string appeared: send this text (what came before it) and stop.
    Stop(String),
}

impl StopStrings {
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.to_vec(),
            pending: String::new(),
        }
    }

    pub fn push(&mut self, text: &str) -> Step {
        self.pending.push_str(text);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min();
        if let Some(at) = first {
            let before = self.pending[..at].to_string();
            self.pending.clear();
            return Step::Stop(before);
        }
        // Hold back the longest tail that some stop string starts with.
        let held = self
            .stops
            .iter()
            .flat_map(|s| {
                (1..s.len())
                    .filter(|&n| s.is_char_boundary(n))
                    .map(move |n| &s[..n])
            })
            .filter(|prefix| self.pending.ends_with(prefix))
            .map(str::len)
            .max()
            .unwrap_or(0);
        let cut = self.pending.len() - held;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        Step::Emit(out)
    }

    /// What is still held back when the output ends without a stop string.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut s = StopStrings::new(&stops);
        let mut out = String::new();
        for p in pieces {
            match s.push(p) {
                Step::Emit(t) => out.push_str(&t),
                Step::Stop(t) => {
                    out.push_str(&t);
                    return (out, true);
                }
            }
        }
        out.push_str(&s.finish());
        (out, false)
    }

    #[test]
    fn stops_across_pieces_and_holds_back_prefixes() {
        assert_eq!(
            run(&["END"], &["abc E", "N", "D more"]),
            ("abc ".into(), true)
        );
        assert_eq!(
            run(&["END"], &["abc E", "N", "x"]),
            ("abc ENx".into(), false)
        );
        assert_eq!(run(&["xy", "b"], &["aab", "xy"]), ("aa".into(), true));
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
        assert_eq!(run(&["世界"], &["你好世", "界!"]), ("你好".into(), true));
    }
}
