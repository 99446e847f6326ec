//! A callback on a tensor's gradient during the backward pass (PyTorch's
//! `Tensor.register_hook`, which tch does not expose; `src/grad_hook.cpp`). The per-sample
//! gradient book-keeping takes a layer's per-sample norms from its output gradient as autograd
//! computes it and lets that gradient go, instead of holding every layer's at once
//! (`privacy::grad_sample::squared_norms_in_backward`).
//!
//! The hook belongs to the tensor's autograd node: it lives as long as the tensor (or a graph
//! that holds its node) does, and its callback is dropped with it. On a CUDA tensor autograd
//! calls it from its device thread while the thread that started the backward pass waits, hence
//! `Send`.

use crate::error::{Error, Result};
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use tch::Tensor;
use torch_sys::C_tensor;

extern "C" {
    fn dpcomp_register_grad_hook(
        tensor: *mut C_tensor,
        callback: extern "C" fn(*mut c_void, *mut C_tensor),
        context: *mut c_void,
        drop_context: extern "C" fn(*mut c_void),
    ) -> i32;
    fn dpcomp_reaches_another(tensors: *const *mut C_tensor, count: i64, reaches: *mut u8) -> i32;
}

/// What a hook's callback left behind: the message of a panic inside it (a panic must not
/// unwind into C++; later calls are skipped).
#[derive(Clone, Default)]
pub struct HookStatus(Arc<Mutex<Option<String>>>);

impl HookStatus {
    /// The panic message of the callback, if it panicked (later calls were then skipped).
    pub fn panicked(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The callback and where its panic goes; owned by the C++ side once registered.
struct Slot {
    callback: Box<dyn FnMut(Tensor) + Send>,
    status: HookStatus,
}

extern "C" fn call(context: *mut c_void, grad: *mut C_tensor) {
    // SAFETY: `context` is the `Slot` boxed in `on_grad`, alive until `drop_slot`; `grad` is a
    // new tensor handle this side owns.
    let slot = unsafe { &mut *(context as *mut Slot) };
    let grad = unsafe { Tensor::from_ptr(grad) };
    if slot.status.panicked().is_some() {
        return;
    }
    if let Err(panic) = catch_unwind(AssertUnwindSafe(|| (slot.callback)(grad))) {
        let what = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic without a message".to_string());
        *slot.status.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(what);
    }
}

extern "C" fn drop_slot(context: *mut c_void) {
    // SAFETY: called once, by the last owner of the context, with the pointer `on_grad` leaked.
    drop(unsafe { Box::from_raw(context as *mut Slot) });
}

/// Calls `callback` with `tensor`'s gradient each time a backward pass computes it, for as long
/// as the tensor's autograd node lives. `tensor` must require grad. The returned status reports
/// a panic inside the callback.
pub fn on_grad(
    tensor: &Tensor,
    callback: impl FnMut(Tensor) + Send + 'static,
) -> Result<HookStatus> {
    if !tensor.requires_grad() {
        return Err(Error::bad_value(
            "tensor",
            "a gradient hook needs a tensor that requires grad",
        ));
    }
    let status = HookStatus::default();
    let slot = Box::new(Slot {
        callback: Box::new(callback),
        status: status.clone(),
    });
    let context = Box::into_raw(slot) as *mut c_void;
    let mut tensor = tensor.shallow_clone();
    // SAFETY: a valid tensor handle; the C++ side owns `context` from here and frees it through
    // `drop_slot` (on failure too).
    let done = unsafe { dpcomp_register_grad_hook(tensor.as_mut_ptr(), call, context, drop_slot) };
    if done != 0 {
        return Err(Error::bad_value(
            "tensor",
            "LibTorch refused the gradient hook",
        ));
    }
    Ok(status)
}

/// For each tensor on the autograd graph, whether the backward pass from it goes on to another
/// of `tensors` (one upstream of it). A backward pass asked for the gradients of those that do
/// not (the earliest) runs through every other one's node, so their hooks fire, while holding
/// only the earliest ones' gradients at its end. A tensor off the graph (a leaf, or one without
/// grad) reaches nothing.
pub fn reaches_another(tensors: &[&Tensor]) -> Result<Vec<bool>> {
    let mut handles: Vec<Tensor> = tensors.iter().map(|t| t.shallow_clone()).collect();
    let pointers: Vec<*mut C_tensor> = handles.iter_mut().map(|t| t.as_mut_ptr()).collect();
    let mut reaches = vec![0u8; tensors.len()];
    // SAFETY: `pointers` are valid tensor handles kept alive by `handles` for the call; `reaches`
    // has one byte per tensor.
    let done = unsafe {
        dpcomp_reaches_another(
            pointers.as_ptr(),
            pointers.len() as i64,
            reaches.as_mut_ptr(),
        )
    };
    if done != 0 {
        return Err(Error::bad_value(
            "tensor",
            "LibTorch failed to walk the autograd graph",
        ));
    }
    Ok(reaches.into_iter().map(|r| r != 0).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hook_sees_the_gradient_during_backward_and_goes_with_its_tensor() {
        let x = Tensor::from_slice(&[1.0f64, -2.0, 3.0]).set_requires_grad(true);
        let y = &x * 3.0;
        let seen: Arc<Mutex<Vec<Tensor>>> = Arc::default();
        let store = seen.clone();
        on_grad(&y, move |g| store.lock().unwrap().push(g)).unwrap();
        assert_eq!(Arc::strong_count(&seen), 2, "the hook holds its callback");
        // d/dy Σ y² = 2y.
        (&y * &y).sum(tch::Kind::Double).backward();
        assert_eq!(seen.lock().unwrap().len(), 1);
        assert!(crate::host::equal(
            &seen.lock().unwrap()[0],
            &(&y * 2.0).detach()
        ));
        assert!(crate::host::equal(&x.grad(), &(&x * 18.0).detach()));
        // The callback is dropped with the tensor's autograd node.
        drop(y);
        assert_eq!(
            Arc::strong_count(&seen),
            1,
            "the callback outlived its tensor"
        );
        // A panic inside the callback is caught and reported, never unwound into LibTorch.
        let z = &x * 2.0;
        let status = on_grad(&z, |_| panic!("boom")).unwrap();
        z.sum(tch::Kind::Double).backward();
        assert_eq!(status.panicked().as_deref(), Some("boom"));
        assert!(on_grad(&Tensor::from(1.0f64), |_| {}).is_err());
    }

    #[test]
    fn the_earliest_tensors_on_the_graph_reach_no_other() {
        let x = Tensor::from_slice(&[1.0f64, -2.0]).set_requires_grad(true);
        let w = Tensor::from_slice(&[0.5f64, 4.0]).set_requires_grad(true);
        // Two branches from x and one from w join: a and c are the earliest; b (from a), d (from
        // b and c) and e (from d, through an op with no recorded tensor between) reach others.
        let a = &x * 2.0;
        let b = a.exp();
        let c = &w + 1.0;
        let d = &b * &c;
        let e = d.sum(tch::Kind::Double).sin();
        let reaches = reaches_another(&[&a, &b, &c, &d, &e]).unwrap();
        assert_eq!(reaches, vec![false, true, false, true, true]);
        // Leaves and tensors without grad are off the graph.
        let reaches = reaches_another(&[&x, &Tensor::from(1.0f64), &a]).unwrap();
        assert_eq!(reaches, vec![false, false, false]);
    }
}
