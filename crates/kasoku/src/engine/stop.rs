//! Stop strings over streamed text: releases text as soon as it cannot be the start of a stop
//! string, and reports where a stop string ends the answer.

/// Incremental matcher: push text pieces, get back the text safe to show.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
    stopped: bool,
    /// The stop string that ended the answer.
    matched: Option<String>,
}

impl StopMatcher {
    pub fn new(stops: &[String]) -> Self {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            ..Default::default()
        }
    }

    /// Adds generated text; returns the text that can be released now. After a stop string is
    /// seen, returns the text before it and `stopped()` becomes true.
    pub fn push(&mut self, text: &str) -> String {
        if self.stopped {
            return String::new();
        }
        self.pending.push_str(text);
        if let Some((at, stop)) = self
            .stops
            .iter()
            .filter_map(|s| Some((self.pending.find(s.as_str())?, s)))
            .min_by_key(|&(at, _)| at)
        {
            self.stopped = true;
            self.matched = Some(stop.clone());
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return out;
        }
        // Hold back the longest suffix that is a prefix of some stop string.
        let mut hold = 0;
        for s in &self.stops {
            for len in (1..s.len().min(self.pending.len() + 1)).rev() {
                if self.pending.is_char_boundary(self.pending.len() - len)
                    && s.is_char_boundary(len)
                    && self.pending.ends_with(&s[..len])
                {
                    hold = hold.max(len);
                    break;
                }
            }
        }
        let release = self.pending.len() - hold;
        let out = self.pending[..release].to_string();
        self.pending.drain(..release);
        out
    }

    /// Text still held back (released when generation ends without a stop).
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// The stop string that ended the answer, once `stopped()`.
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stops_across_pieces_and_holds_partial_matches() {
        let mut m = StopMatcher::new(&["\n\nUser:".to_string()]);
        assert_eq!(m.push("Hello"), "Hello");
        assert_eq!(m.push(" world\n"), " world");
        assert_eq!(m.push("\nUs"), "");
        assert_eq!(m.push("er: hi"), "");
        assert!(m.stopped());
        assert_eq!(m.matched(), Some("\n\nUser:"));
        // The earliest of several stops is the one that matched.
        let mut m = StopMatcher::new(&["b".to_string(), "a".to_string()]);
        assert_eq!(m.push("xab"), "x");
        assert_eq!(m.matched(), Some("a"));
    }

    #[test]
    fn false_alarm_is_released() {
        let mut m = StopMatcher::new(&["END".to_string()]);
        assert_eq!(m.push("the E"), "the ");
        assert_eq!(m.push("ND"), "");
        assert!(m.stopped());
        let mut m = StopMatcher::new(&["END".to_string()]);
        assert_eq!(m.push("the E"), "the ");
        assert_eq!(m.push("ggs"), "Eggs");
        assert_eq!(m.flush(), "");
        assert!(!m.stopped());
    }

    #[test]
    fn unicode_is_split_on_char_boundaries() {
        let mut m = StopMatcher::new(&["é!".to_string()]);
        assert_eq!(m.push("café"), "caf");
        assert_eq!(m.push(" ok"), "é ok");
    }
}
