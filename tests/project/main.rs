//! The repository itself: docs and their links, the CLI page, user text without history, the test guard, examples, the GPU kit and a fresh machine.
//!
//! One test binary (it links LibTorch once); each module is the tests of one concern.

#[path = "../common/mod.rs"]
mod common;

mod cli_docs;
mod docs_links;
mod example_program;
mod fresh_machine;
mod gpu_kit;
mod library_without_cli;
mod new_user_programs;
mod no_history_in_user_text;
mod seeded_tests_guard;
