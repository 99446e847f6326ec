//! A callback on a tensor's gradient during the backward pass (PyTorch's
//! `Tensor.register_hook`, which tch does not expose; `crates/dpcomp/src/grad_hook.cpp`). The per-sample
//! gradient book-keeping takes a layer's per-sample norms from its output gradient as autograd
//! computes it and lets that gradient go, instead of holding every layer's at once
//! (`privacy::grad_sample::squared_norms_in_backward`).
//!
//! The hook belongs to the tensor's autograd node (`GradEdge`, what the tape holds of a recorded
//! output instead of the output): it lives as long as that node (the graph, or an edge held)
//! does, and its callback is dropped with it. On a CUDA tensor autograd
//! calls it from its device thread while the thread that started the backward pass waits, hence
//! `Send`.

use crate::error::{Error, Result};
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use tch::Tensor;
use torch_sys::C_tensor;

extern "C" {
    fn dpcomp_gradient_edge(tensor: *mut C_tensor) -> *mut c_void;
    fn dpcomp_edge_free(edge: *mut c_void);
    fn dpcomp_register_edge_hook(
        edge: *mut c_void,
        callback: extern "C" fn(*mut c_void, *mut C_tensor),
        context: *mut c_void,
        drop_context: extern "C" fn(*mut c_void),
    ) -> i32;
    fn dpcomp_backward_to_edges(
        root: *mut C_tensor,
        edges: *const *mut c_void,
        count: i64,
        keep_graph: i32,
        outputs: *mut *mut C_tensor,
    ) -> i32;
    fn dpcomp_edges_reach_another(edges: *const *mut c_void, count: i64, reaches: *mut u8) -> i32;
    fn dpcomp_clear_grad(tensor: *mut C_tensor) -> i32;
}

/// Where a tensor's gradient enters the autograd graph: its node and which of the node's
/// outputs it is (for a leaf that requires grad, its gradient accumulator). Held instead of the
/// tensor, it keeps the node alive but not the tensor's memory: the tape holds a recorded
/// layer's output this way, so that an output autograd does not save (a norm's, which the
/// following ReLU does not keep) is freed during the forward pass as it would be without DP.
pub struct GradEdge(*mut c_void);

// SAFETY: the handle owns a C++ struct of two shared pointers (atomic reference counts) that
// nothing mutates after it is made; autograd nodes are used across threads by LibTorch itself.
unsafe impl Send for GradEdge {}
unsafe impl Sync for GradEdge {}

impl GradEdge {
    /// `tensor`'s edge; off the graph (no hook, no gradient) for a tensor without grad, and, for
    /// `reaches_another`, for a leaf.
    pub fn of(tensor: &Tensor) -> Result<GradEdge> {
        let mut tensor = tensor.shallow_clone();
        // SAFETY: a valid tensor handle for the call; the result is a new handle this side owns.
        let edge = unsafe { dpcomp_gradient_edge(tensor.as_mut_ptr()) };
        if edge.is_null() {
            return Err(Error::bad_value(
                "tensor",
                "LibTorch could not give the tensor's autograd edge",
            ));
        }
        Ok(GradEdge(edge))
    }
}

impl Drop for GradEdge {
    fn drop(&mut self) {
        // SAFETY: the handle `dpcomp_gradient_edge` made, freed once.
        unsafe { dpcomp_edge_free(self.0) }
    }
}

/// `on_grad` for the tensor `edge` was taken of, without that tensor: the hook is registered on
/// its autograd node (as `Tensor::register_hook` does for a non-leaf) and lives as long as the
/// node. An error for an edge off the graph.
pub fn on_grad_at(
    edge: &GradEdge,
    callback: impl FnMut(Tensor) + Send + 'static,
) -> Result<HookStatus> {
    let status = HookStatus::default();
    let slot = Box::new(Slot {
        callback: Box::new(callback),
        status: status.clone(),
    });
    let context = Box::into_raw(slot) as *mut c_void;
    // SAFETY: a valid edge handle; the C++ side owns `context` from here and frees it through
    // `drop_slot` (on failure too).
    let done = unsafe { dpcomp_register_edge_hook(edge.0, call, context, drop_slot) };
    if done != 0 {
        return Err(Error::bad_value(
            "tensor",
            "a gradient hook needs a tensor on the autograd graph",
        ));
    }
    Ok(status)
}

/// The gradients of the scalar `root` at `edges` (undefined where none reaches), from one
/// backward pass that accumulates nothing into `.grad`: `Tensor::run_backward` for tensors one
/// no longer holds. An error for an edge without a gradient edge (a tensor without grad).
pub fn backward_to(root: &Tensor, edges: &[&GradEdge], keep_graph: bool) -> Result<Vec<Tensor>> {
    let mut root = root.shallow_clone();
    let handles: Vec<*mut c_void> = edges.iter().map(|e| e.0).collect();
    let mut outputs: Vec<*mut C_tensor> = vec![std::ptr::null_mut(); edges.len()];
    // SAFETY: valid handles for the call; on success each output is a new tensor handle this
    // side owns.
    let done = unsafe {
        dpcomp_backward_to_edges(
            root.as_mut_ptr(),
            handles.as_ptr(),
            handles.len() as i64,
            keep_graph as i32,
            outputs.as_mut_ptr(),
        )
    };
    if done != 0 {
        return Err(Error::bad_value(
            "loss",
            "LibTorch's backward pass to the recorded outputs failed",
        ));
    }
    // SAFETY: each pointer is a new handle from the call above.
    Ok(outputs
        .into_iter()
        .map(|p| unsafe { Tensor::from_ptr(p) })
        .collect())
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
    // SAFETY: `context` is the `Slot` boxed in `on_grad_at`, alive until `drop_slot`; `grad` is a
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
    // SAFETY: called once, by the last owner of the context, with the pointer `on_grad_at` leaked.
    drop(unsafe { Box::from_raw(context as *mut Slot) });
}

/// Calls `callback` with `tensor`'s gradient each time a backward pass computes it, for as long
/// as the tensor's autograd node lives (`on_grad_at` on the tensor's edge). `tensor` must be on
/// the graph (a non-leaf that requires grad). The returned status reports a panic inside the
/// callback.
#[cfg(test)]
pub fn on_grad(
    tensor: &Tensor,
    callback: impl FnMut(Tensor) + Send + 'static,
) -> Result<HookStatus> {
    on_grad_at(&GradEdge::of(tensor)?, callback)
}

/// Drops `tensor`'s accumulated gradient (`.grad()` is undefined afterwards, and its memory is
/// freed once no other handle holds it): PyTorch's `zero_grad(set_to_none=True)`.
pub fn clear_grad(tensor: &Tensor) -> Result<()> {
    let mut tensor = tensor.shallow_clone();
    // SAFETY: a valid tensor handle for the call; only its gradient slot changes.
    if unsafe { dpcomp_clear_grad(tensor.as_mut_ptr()) } != 0 {
        return Err(Error::bad_value(
            "tensor",
            "LibTorch could not drop the tensor's gradient",
        ));
    }
    Ok(())
}

/// For each tensor on the autograd graph, whether the backward pass from it goes on to another
/// of `tensors` (one upstream of it). A backward pass asked for the gradients of those that do
/// not (the earliest) runs through every other one's node, so their hooks fire, while holding
/// only the earliest ones' gradients at its end. A tensor off the graph (a leaf, or one without
/// grad) reaches nothing.
#[cfg(test)]
pub fn reaches_another(tensors: &[&Tensor]) -> Result<Vec<bool>> {
    let edges = tensors
        .iter()
        .map(|t| GradEdge::of(t))
        .collect::<Result<Vec<_>>>()?;
    edges_reach_another(&edges.iter().collect::<Vec<_>>())
}

/// `reaches_another` for edges (`GradEdge`): the tensors they were taken of need not be held.
pub fn edges_reach_another(edges: &[&GradEdge]) -> Result<Vec<bool>> {
    let handles: Vec<*mut c_void> = edges.iter().map(|e| e.0).collect();
    let mut reaches = vec![0u8; edges.len()];
    // SAFETY: valid edge handles for the call; `reaches` has one byte per edge.
    let done = unsafe {
        dpcomp_edges_reach_another(handles.as_ptr(), handles.len() as i64, reaches.as_mut_ptr())
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
    fn a_cleared_gradient_is_undefined_and_the_next_backward_starts_from_zero() {
        let x = Tensor::from_slice(&[1.0f32, 2.0]).set_requires_grad(true);
        (&x * 3.0).sum(tch::Kind::Float).backward();
        assert!(x.grad().defined());
        clear_grad(&x).unwrap();
        assert!(!x.grad().defined());
        (&x * 5.0).sum(tch::Kind::Float).backward();
        assert!(crate::host::equal(
            &x.grad(),
            &Tensor::from_slice(&[5.0f32, 5.0])
        ));
    }

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
