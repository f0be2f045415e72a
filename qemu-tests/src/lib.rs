//! End-to-end scenarios that boot QEMU images.
