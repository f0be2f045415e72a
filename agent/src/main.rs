//! `certrotor` binary: parse arguments, call the library, turn the outcome into an exit code.
//! The command line lives here, outside the library, so that the library never depends on it.
#![deny(unsafe_code)]

mod cli;

fn main() -> std::process::ExitCode {
    crypto_alloc::install();
    cli::main(std::env::args().collect())
}

/// dlmalloc rather than musl's mallocng, which unmaps every freed group: a `check` made ~85
/// mmap/munmap pairs and as many page faults (ARCHITECTURE.md "Speed").
#[global_allocator]
static ALLOC: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

/// aws-lc allocates through libc's `malloc` (musl's mallocng in the static binary), which maps
/// and unmaps a page pair around each signature check: 22 mmap/munmap pairs in a `check`. These
/// hooks give aws-lc's allocations to the binary's allocator instead, and keep what aws-lc's own
/// `OPENSSL_free` does: the freed block is zeroed (key material never lingers in freed memory).
mod crypto_alloc {
    use std::alloc::{GlobalAlloc, Layout};
    use std::os::raw::{c_char, c_int, c_void};

    /// Room before each block for its size; 16 keeps the block 16-byte aligned like malloc's.
    const HEADER: usize = 16;

    fn layout(size: usize) -> Option<Layout> {
        Layout::from_size_align(size.checked_add(HEADER)?, HEADER).ok()
    }

    #[allow(unsafe_code)]
    unsafe extern "C" fn malloc(size: usize, _file: *const c_char, _line: c_int) -> *mut c_void {
        let Some(layout) = layout(size) else {
            return std::ptr::null_mut();
        };
        // SAFETY: the layout's size is at least HEADER, never zero.
        let base = unsafe { super::ALLOC.alloc(layout) };
        if base.is_null() {
            return std::ptr::null_mut();
        }
        // SAFETY: `base` is valid for HEADER + size bytes and 16-byte aligned: the size is
        // stored at its start and the block handed out after the header.
        unsafe {
            base.cast::<usize>().write(size);
            base.add(HEADER).cast()
        }
    }

    /// The size a block was allocated with.
    ///
    /// # Safety
    /// `ptr` comes from [`malloc`] and was not freed.
    #[allow(unsafe_code)]
    unsafe fn size_of(ptr: *mut c_void) -> (*mut u8, usize) {
        // SAFETY: per the contract, the header sits HEADER bytes before `ptr`.
        unsafe {
            let base = ptr.cast::<u8>().sub(HEADER);
            (base, base.cast::<usize>().read())
        }
    }

    #[allow(unsafe_code)]
    unsafe extern "C" fn free(ptr: *mut c_void, _file: *const c_char, _line: c_int) {
        if ptr.is_null() {
            return;
        }
        // SAFETY: aws-lc frees only what its allocator (this `malloc`) returned, once.
        let (base, size) = unsafe { size_of(ptr) };
        let Some(layout) = layout(size) else { return };
        // SAFETY: `base` is the block of `layout` that `malloc` allocated; it is zeroed (volatile
        // writes, as OPENSSL_cleanse) and returned to the allocator with the same layout.
        unsafe {
            zeroize::Zeroize::zeroize(std::slice::from_raw_parts_mut(base, layout.size()));
            super::ALLOC.dealloc(base, layout);
        }
    }

    #[allow(unsafe_code)]
    unsafe extern "C" fn realloc(
        ptr: *mut c_void,
        new_size: usize,
        file: *const c_char,
        line: c_int,
    ) -> *mut c_void {
        // SAFETY: as aws-lc's own OPENSSL_realloc: a new block, the old contents copied, the old
        // block zeroed and freed; `ptr` is null or a live block from `malloc`.
        unsafe {
            let new = malloc(new_size, file, line);
            if ptr.is_null() || new.is_null() {
                return new;
            }
            let (_, old_size) = size_of(ptr);
            std::ptr::copy_nonoverlapping(ptr.cast::<u8>(), new.cast(), old_size.min(new_size));
            free(ptr, file, line);
            new
        }
    }

    /// Installs the hooks; must run before aws-lc allocates anything (first thing in `main`).
    pub fn install() {
        // SAFETY: called once, before any other aws-lc function; the three functions keep
        // aws-lc's allocator contract (above). A refusal (hooks already set) leaves aws-lc on
        // libc's malloc, which is correct too.
        #[allow(unsafe_code)]
        unsafe {
            aws_lc_sys::CRYPTO_set_mem_functions(Some(malloc), Some(realloc), Some(free));
        }
    }
}
