//! Release builds of the binary only: no `.eh_frame_hdr` (the lookup table of the unwind
//! tables). certrotor is built with `panic = "abort"` and never unwinds; the table only serves a
//! panic backtrace, which the stripped binary cannot name anyway: 60 KB.
fn main() {
    println!("cargo:rerun-if-env-changed=PROFILE");
    if std::env::var("PROFILE").as_deref() == Ok("release") {
        println!("cargo:rustc-link-arg-bins=-Wl,--no-eh-frame-hdr");
    }
}
