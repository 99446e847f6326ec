//! What the hand-differentiated recurrent layers (`Lstm`, `Gru`) share: time-major stacking of
//! per-step tensors, h_{t-1} from h_t, and handing hand-computed gradients to autograd.

use tch::Tensor;

/// [x_0, ..., x_{T-1}] -> [0, x_0, ..., x_{T-2}] along the first dimension.
pub(crate) fn shift_in_zero(xs: &Tensor) -> Tensor {
    let steps = xs.size()[0];
    let zero = xs.get(0).zeros_like().unsqueeze(0);
    Tensor::cat(&[zero, xs.narrow(0, 0, steps - 1)], 0)
}

/// The `k`-th tensor of every step stacked time-major, [T, ...].
pub(crate) fn stack_steps<const N: usize>(steps: &[[Tensor; N]], k: usize) -> Tensor {
    let parts: Vec<Tensor> = steps.iter().map(|s| s[k].shallow_clone()).collect();
    Tensor::stack(&parts, 0)
}

/// Accumulates hand-computed gradients into `.grad()` exactly as `backward()` would, and carries
/// `d_input` into the layers before: one autograd call on Σ θ ⊙ dθ + Σ x ⊙ dx, since
/// d/dθ Σ θ ⊙ dθ = dθ and d/dφ Σ x(φ) ⊙ dx = (∂x/∂φ)ᵀ dx. Frozen parameters and an input
/// that needs no gradient are skipped.
pub(crate) fn hand_to_autograd(
    parameters: &[(&Tensor, &Tensor)],
    input: &Tensor,
    d_input: &Tensor,
) {
    let kind = d_input.kind();
    let mut surrogate: Vec<Tensor> = parameters
        .iter()
        .filter(|(param, _)| param.requires_grad())
        .map(|(param, grad)| (*param * *grad).sum(kind))
        .collect();
    if input.requires_grad() {
        surrogate.push((input * d_input).sum(kind));
    }
    if !surrogate.is_empty() {
        Tensor::stack(&surrogate, 0).sum(kind).backward();
    }
}
