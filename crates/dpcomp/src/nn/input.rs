//! The checks a layer runs on its input before it calls LibTorch, so that a shape a layer cannot
//! take is an `Error` naming the layer and both shapes, not a panic with C++ frames.
//! They read tensor sizes only (metadata on the host): no device synchronisation, and the
//! layer's name is formatted only when there is an error.

use crate::error::{Error, Result};
use tch::{TchError, Tensor};

/// An input of shape `xs.size()` that `layer` cannot take; `expected` says what it takes.
pub(crate) fn wrong_shape(layer: &str, xs: &Tensor, expected: &str) -> Error {
    Error::bad_value(
        format!("{layer} input"),
        format!("shape {:?}, expected {expected}", xs.size()),
    )
}

/// `xs` has a rank in `rank` and size `size` along `dim` (negative counts from the end);
/// otherwise the error names `layer()` and says `expected()`.
pub(crate) fn expect_dim(
    xs: &Tensor,
    rank: std::ops::RangeInclusive<usize>,
    dim: i64,
    size: i64,
    layer: impl Fn() -> String,
    expected: impl Fn() -> String,
) -> Result<()> {
    let shape = xs.size();
    let index = if dim < 0 {
        shape.len() as i64 + dim
    } else {
        dim
    };
    let fits = rank.contains(&shape.len())
        && index >= 0
        && shape.get(index as usize).is_some_and(|&s| s == size);
    if fits {
        Ok(())
    } else {
        Err(wrong_shape(&layer(), xs, &expected()))
    }
}

/// A LibTorch error from `layer`'s kernel (an input the checks above let through, such as a
/// mask that does not broadcast), as an `Error` naming the layer, without the C++ frames.
pub(crate) fn kernel_error(layer: &str, error: TchError) -> Error {
    let message = match error {
        TchError::Torch(message) => message,
        other => other.to_string(),
    };
    let first_line = message.lines().next().unwrap_or("").trim();
    Error::bad_value(format!("{layer} input"), first_line.to_string())
}

/// Each `(argument, value, low)` of a `layer`'s constructor is at least `low`; otherwise an
/// [`Error::BadValue`] on `"{layer} {argument}"` saying the value and the bound (the
/// constructors' size checks: a layer of 0 or negative width is an error, not a panic in
/// LibTorch or an empty tensor).
pub(crate) fn at_least<const N: usize>(
    layer: &str,
    arguments: [(&str, i64, i64); N],
) -> Result<()> {
    for (argument, value, low) in arguments {
        if value < low {
            return Err(Error::bad_value(
                format!("{layer} {argument}"),
                format!("{value}, expected at least {low}"),
            ));
        }
    }
    Ok(())
}
