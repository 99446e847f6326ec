//! One progress bar for the places that draw one when the caller asks (federated rounds,
//! downloads): indicatif's with the `progress` feature. Without the feature a hidden bar is all
//! there is, and asking for a shown one is an error naming the feature, so a `progress: true`
//! is never ignored silently.
#[cfg(not(feature = "progress"))]
use crate::error::Error;
use crate::error::Result;

/// A bar on stderr, or a hidden one that draws nothing.
pub(crate) struct Bar {
    #[cfg(feature = "progress")]
    inner: indicatif::ProgressBar,
}

impl Bar {
    /// A bar that draws nothing.
    pub(crate) fn hidden() -> Bar {
        Bar {
            #[cfg(feature = "progress")]
            inner: indicatif::ProgressBar::hidden(),
        }
    }

    /// A bar of `length` steps drawn with indicatif's `template`, or a hidden one when `show` is
    /// false. `what` names the setting that asked for it, for the error without the feature.
    pub(crate) fn new(show: bool, length: u64, template: &str, what: &str) -> Result<Bar> {
        if !show {
            return Ok(Bar::hidden());
        }
        #[cfg(feature = "progress")]
        {
            let _ = what;
            let bar = indicatif::ProgressBar::new(length);
            bar.set_style(
                indicatif::ProgressStyle::with_template(template)
                    .expect("valid template")
                    .progress_chars("=> "),
            );
            Ok(Bar { inner: bar })
        }
        #[cfg(not(feature = "progress"))]
        {
            let _ = (length, template);
            Err(Error::bad_value(
                what,
                "a progress bar needs dpcomp's `progress` feature: add `features = [\"progress\"]` to the dependency, or turn progress off",
            ))
        }
    }

    pub(crate) fn inc(&self, steps: u64) {
        #[cfg(feature = "progress")]
        self.inner.inc(steps);
        #[cfg(not(feature = "progress"))]
        let _ = steps;
    }

    #[cfg_attr(not(feature = "fetch"), allow(dead_code))]
    pub(crate) fn set_position(&self, position: u64) {
        #[cfg(feature = "progress")]
        self.inner.set_position(position);
        #[cfg(not(feature = "progress"))]
        let _ = position;
    }

    pub(crate) fn set_message(&self, message: String) {
        #[cfg(feature = "progress")]
        self.inner.set_message(message);
        #[cfg(not(feature = "progress"))]
        let _ = message;
    }

    pub(crate) fn finish_and_clear(&self) {
        #[cfg(feature = "progress")]
        self.inner.finish_and_clear();
    }
}
