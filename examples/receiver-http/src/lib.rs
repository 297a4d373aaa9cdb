//! The small HTTP/1.1 server under stephost's scripted receivers (the other
//! side of the network in its tests and examples): the supplier receiver, the
//! model server, and the tests' webhook, OTLP and model stubs.
//!
//! - [`message`]: a strict request parser and the response writers (whole,
//!   cut short, streamed);
//! - [`server`]: a listener with a thread per connection that hands each
//!   request to a [`Service`] and stops cleanly.

pub mod message;
pub mod server;

pub use message::{ReadError, Request, Response, StreamWriter, percent_decode};
pub use server::{Conn, Server, Service};
