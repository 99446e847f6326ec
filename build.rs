//! Writes an rpath to LibTorch's `lib` folder into the `dpcomp` binary, the tests and the
//! examples, so they run without `LD_LIBRARY_PATH`: dpcomp's build script reports that folder
//! as `DEP_DPCOMP_LIBTORCH_LIB`. With a CUDA build of LibTorch it also links `libtorch_cuda.so`
//! with `--no-as-needed`: no symbol of it is referenced directly, so the linker would drop it
//! and CUDA would never be registered.
use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let lib =
        std::env::var("DEP_DPCOMP_LIBTORCH_LIB").expect("dpcomp reports LibTorch's lib folder");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    if Path::new(&lib).join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-ltorch_cuda");
        println!("cargo:rustc-link-arg=-Wl,--as-needed");
    }
}
