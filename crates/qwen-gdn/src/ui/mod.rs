//! The terminal: writing to stdout and stderr, progress bars, how `chat` reads its lines and
//! prints a streamed reply.

pub mod chat_input;
pub mod output;
pub mod progress;
pub mod reply_display;
