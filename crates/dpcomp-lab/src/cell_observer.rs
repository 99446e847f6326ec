//! Who hears of an experiment's cells while `ExperimentFile::run` (`dpcomp grid`) runs them:
//! which cell starts, resumes, is skipped or is left to another process, each finished cell's
//! one-line result, and the observers of each cell's trainer or federated rounds. Nobody by default (`()`), so a
//! grid run from a program of one's own is silent; the command line installs lines and progress
//! bars on stderr.

use dpcomp::fl::observer::RoundObserver;
use dpcomp::train::observer::Observer;

/// What happens to a cell.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CellEvent<'a> {
    /// It finished in an earlier run: skipped.
    Skipped,
    /// It starts from nothing.
    Starting,
    /// It continues from its checkpoint after `epochs_done` epochs.
    Resuming {
        /// The epochs its checkpoint has trained.
        epochs_done: usize,
    },
    /// Another process holds it (`owner` describes that process): left to it.
    InUse {
        /// The holder's pid, host and start time (`run_lock`).
        owner: &'a str,
    },
    /// It finished now; `result` is its one-line summary where the kind has one (a convex
    /// setting's excess risk and accuracy over its seeds).
    Finished {
        /// The summary line, if any.
        result: Option<&'a str>,
    },
}

/// Hears of an experiment's cells (module docs). Every method does nothing by default.
pub trait CellObserver {
    /// Cell `index` (0-based) of the `cells` the run covers, named `name`, in `experiment`.
    fn cell(
        &mut self,
        _experiment: &str,
        _index: usize,
        _cells: usize,
        _name: &str,
        _event: CellEvent<'_>,
    ) {
    }

    /// The observers of the trainer that trains the next cell (none by default).
    fn trainer_observers(&mut self) -> Vec<Box<dyn Observer>> {
        Vec::new()
    }

    /// The observers of the next federated cell's rounds (none by default).
    fn round_observers(&mut self) -> Vec<Box<dyn RoundObserver>> {
        Vec::new()
    }
}

/// Nobody hears: a silent run.
impl CellObserver for () {}
