//! A whole answer gathered from a worker's events: what the non-streaming replies of every
//! API (chat completions, completions, Anthropic messages, responses) are built from.

use tokio::sync::mpsc::UnboundedReceiver;

use crate::error::ApiError;
use crate::logprobs::Entry;
use crate::pool::{Done, Event};
use crate::tool_calls::{ToolCall, ToolEvent};

/// An answer's text, reasoning and tool calls.
#[derive(Debug, Default)]
pub struct Answer {
    pub content: String,
    pub reasoning: String,
    pub calls: Vec<ToolCall>,
    /// Every generated token's log-probabilities, when asked for.
    pub logprobs: Vec<Entry>,
}

impl Answer {
    /// Adds one event's pieces.
    pub fn add(&mut self, delta: &crate::output::Delta) {
        self.content.push_str(&delta.content);
        self.reasoning.push_str(&delta.reasoning);
        self.logprobs.extend(delta.logprobs.iter().cloned());
        for e in &delta.tool_calls {
            match e {
                ToolEvent::Start { id, name, .. } => self.calls.push(ToolCall {
                    id: id.clone(),
                    name: name.clone(),
                    arguments: String::new(),
                }),
                ToolEvent::Arguments { index, delta } => {
                    if let Some(c) = self.calls.get_mut(*index) {
                        c.arguments.push_str(delta);
                    }
                }
                ToolEvent::Content(t) => self.content.push_str(t),
            }
        }
    }
}

/// Waits for the whole answer: `first` and what follows it.
pub async fn collect(
    first: Event,
    rx: &mut UnboundedReceiver<Event>,
) -> Result<(Answer, Box<Done>), ApiError> {
    let mut answer = Answer::default();
    let mut event = Some(first);
    loop {
        let next = match event.take() {
            Some(e) => Some(e),
            None => rx.recv().await,
        };
        match next {
            Some(Event::Delta(d)) => answer.add(&d),
            Some(Event::Done(done)) => return Ok((answer, done)),
            Some(Event::Error(e)) => return Err(e),
            None => return Err(ApiError::internal("generation ended without a result")),
        }
    }
}
