//! Stop strings over streamed text: text is held back while it could still be the start of a
//! stop string, so the text before a stop string is emitted and the stop string never is.

pub struct StopStrings {
    stops: Vec<String>,
    /// Text received but not yet released (a possible start of a stop string).
    held: String,
}

/// What a piece of text gives.
#[derive(Debug, PartialEq, Eq)]
pub enum Scan {
    /// Text that can be emitted; generation goes on.
    Emit(String),
    /// A stop string was completed: emit this text (before it), then stop.
    Stop(String),
}

impl StopStrings {
    /// Empty stop strings are ignored (they would match everywhere).
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
        }
    }

    pub fn push(&mut self, text: &str) -> Scan {
        self.held.push_str(text);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first {
            let before = self.held[..at].to_string();
            self.held.clear();
            return Scan::Stop(before);
        }
        let keep = self.longest_partial_suffix();
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        Scan::Emit(out)
    }

    /// What is still held back, at the end of generation (no stop string came).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of the held text that is a proper prefix of a stop string.
    fn longest_partial_suffix(&self) -> usize {
        let held = self.held.as_str();
        self.stops
            .iter()
            .flat_map(|stop| {
                (1..stop.len().min(held.len() + 1))
                    .rev()
                    .filter(|&n| stop.is_char_boundary(n) && held.ends_with(&stop[..n]))
                    .take(1)
            })
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stops(list: &[&str]) -> StopStrings {
        StopStrings::new(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn text_before_a_stop_string_split_over_pieces_is_emitted_and_the_stop_is_not() {
        let mut s = stops(&["STOP"]);
        assert_eq!(s.push("hello S"), Scan::Emit("hello ".into()));
        assert_eq!(s.push("T"), Scan::Emit(String::new()));
        assert_eq!(s.push("OP and more"), Scan::Stop(String::new()));
    }

    #[test]
    fn a_false_start_is_released() {
        let mut s = stops(&["STOP"]);
        assert_eq!(s.push("ST"), Scan::Emit(String::new()));
        assert_eq!(s.push("ART"), Scan::Emit("START".into()));
        assert_eq!(s.push("x ST"), Scan::Emit("x ".into()));
        assert_eq!(s.finish(), "ST");
    }

    #[test]
    fn the_earliest_of_several_stop_strings_wins() {
        let mut s = stops(&["world", "lo w", ""]);
        assert_eq!(s.push("hello world"), Scan::Stop("hel".into()));
    }

    #[test]
    fn multibyte_stop_strings_are_cut_at_character_boundaries() {
        let mut s = stops(&["世界"]);
        assert_eq!(s.push("你好世"), Scan::Emit("你好".into()));
        assert_eq!(s.push("界!"), Scan::Stop(String::new()));
    }
}
