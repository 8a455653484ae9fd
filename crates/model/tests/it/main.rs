//! The providers against a real HTTP exchange with a local OpenAI-compatible endpoint, and the
//! catalog that builds them from agent settings.

mod catalog;
mod openai;
mod retry;
mod support;
