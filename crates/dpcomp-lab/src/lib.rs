//! dpcomp-lab: the papers' lab on the dpcomp framework. The four tasks of Lin 2022 with their
//! defaults ([`tasks`]), experiment files and grids ([`experiment`], [`grid`]), the federated
//! and audit experiments, figures ([`plot`], feature `plot`), measurements ([`analysis`]),
//! DP-SGD for convex losses ([`convex`], Wang et al. 2022) and the benchmarks ([`mod@bench`]).
//! The `dpcomp` command line runs all of it; a program of one's own needs only the framework.
//!
//! The papers, cited in these docs by author and year: Lin 2022, "On the Interaction Between
//! Differential Privacy and Gradient Compression in Deep Learning"; Kerkouche, Ács, Castelluccia
//! and Genevès 2021, "Compression Boosts Differentially Private Federated Learning"; Wang, Lei,
//! Ying and Zhang 2022, "Differentially Private SGD with Non-Smooth Losses"; and for the audits,
//! Steinke, Nasr and Jagielski 2023, "Privacy Auditing with One (1) Training Run".
#![deny(missing_docs)]

pub mod analysis;
pub(crate) mod audit_experiment;
pub mod bench;
pub mod cell_observer;
pub mod convex;
pub mod csv_table;
pub mod experiment;
pub mod fl_experiment;
pub mod grid;
#[cfg(feature = "plot")]
pub mod plot;
pub mod results_table;
pub mod tasks;

pub use tasks::Task;

/// The Rust snippets of README.md and of the guide's pages, compiled by `cargo test --doc` (and
/// run, unless marked `no_run`) here, where both the framework and the lab are in reach, so
/// that they follow the API instead of drifting from it. One struct per file, so that a failing snippet's test names its file (its "line" is the
/// attribute's line plus the snippet's line in the file, minus 1); lines starting with `# `
/// (setup the page leaves out) are compiled but not shown by rustdoc. A page added here needs its
/// shell and output blocks tagged (`bash`, `text`): rustdoc compiles an untagged block as Rust.
#[cfg(doctest)]
mod markdown_doctests {
    #[doc = include_str!("../../../README.md")]
    pub struct ReadMe;
    #[doc = include_str!("../../../docs/guide/auditing.md")]
    pub struct GuideAuditing;
    #[doc = include_str!("../../../docs/guide/compression.md")]
    pub struct GuideCompression;
    #[doc = include_str!("../../../docs/guide/distributed.md")]
    pub struct GuideDistributed;
    #[doc = include_str!("../../../docs/guide/fine-tuning.md")]
    pub struct GuideFineTuning;
    #[doc = include_str!("../../../docs/guide/install.md")]
    pub struct GuideInstall;
    #[doc = include_str!("../../../docs/guide/library.md")]
    pub struct GuideLibrary;
    #[doc = include_str!("../../../docs/guide/privacy.md")]
    pub struct GuidePrivacy;
}
