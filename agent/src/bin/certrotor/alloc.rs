//! The binary's allocators: dlmalloc as Rust's global allocator ([`heap`]), and aws-lc's
//! allocations handed to it ([`crypto`]). Measured choices (ARCHITECTURE.md, "Decisions"): musl's
//! mallocng unmaps every freed group, which cost `check` about 85 mmap/munmap pairs and page
//! faults.

/// dlmalloc behind std's futex mutex, whose uncontended lock and unlock are one atomic
/// instruction each: `dlmalloc::GlobalDlmalloc` takes a libc `pthread_mutex` through two calls
/// per allocation, ~3% of a `check` (3,700 allocations and frees). No fork handler (the crate's
/// holds its lock across `fork`): nothing certrotor runs between `fork` and `exec` allocates.
pub mod heap {
    use std::alloc::{GlobalAlloc, Layout};
    use std::sync::{Mutex, MutexGuard, PoisonError};

    struct Dl(dlmalloc::Dlmalloc<Prefaulted>);

    /// dlmalloc's memory from the kernel: `dlmalloc::System`'s anonymous mappings, with the page
    /// tables of each region up to [`PREFAULT_MAX`] filled as it is mapped (`MAP_POPULATE`), in
    /// one call, instead of one page fault per page as the heap first touches it (~30 of a
    /// `check`'s 130 faults). A larger region (a big buffer that may stay partly unused) keeps
    /// the page faults.
    struct Prefaulted;

    const PREFAULT_MAX: usize = 128 * 1024;

    // SAFETY: the contract of `dlmalloc::Allocator`, as `dlmalloc::System` keeps it on Linux:
    // fresh zeroed read-write anonymous regions, moved, shrunk and unmapped only as asked.
    #[allow(unsafe_code)]
    unsafe impl dlmalloc::Allocator for Prefaulted {
        fn alloc(&self, size: usize) -> (*mut u8, usize, u32) {
            use nix::sys::mman::{MapFlags, ProtFlags, mmap_anonymous};
            let Some(len) = std::num::NonZeroUsize::new(size) else {
                return (std::ptr::null_mut(), 0, 0);
            };
            let mut flags = MapFlags::MAP_PRIVATE;
            if size <= PREFAULT_MAX {
                flags |= MapFlags::MAP_POPULATE;
            }
            let prot = ProtFlags::PROT_READ | ProtFlags::PROT_WRITE;
            // SAFETY: a new private anonymous mapping aliases nothing.
            match unsafe { mmap_anonymous(None, len, prot, flags) } {
                Ok(region) => (region.as_ptr().cast(), size, 0),
                Err(_) => (std::ptr::null_mut(), 0, 0),
            }
        }

        fn remap(&self, ptr: *mut u8, old: usize, new: usize, can_move: bool) -> *mut u8 {
            use nix::sys::mman::{MRemapFlags, mremap};
            let Some(region) = std::ptr::NonNull::new(ptr.cast()) else {
                return std::ptr::null_mut();
            };
            let flags = if can_move {
                MRemapFlags::MREMAP_MAYMOVE
            } else {
                MRemapFlags::empty()
            };
            // SAFETY: `ptr` is a region of `old` bytes that dlmalloc mapped here and owns.
            match unsafe { mremap(region, old, new, flags, None) } {
                Ok(moved) => moved.as_ptr().cast(),
                Err(_) => std::ptr::null_mut(),
            }
        }

        fn free_part(&self, ptr: *mut u8, old: usize, new: usize) -> bool {
            use nix::sys::mman::{MRemapFlags, mremap, munmap};
            let Some(region) = std::ptr::NonNull::new(ptr.cast()) else {
                return false;
            };
            // SAFETY: as `remap`; the tail past `new` is dlmalloc's and no longer used.
            unsafe {
                mremap(region, old, new, MRemapFlags::empty(), None).is_ok()
                    || munmap(region.byte_add(new), old - new).is_ok()
            }
        }

        fn free(&self, ptr: *mut u8, size: usize) -> bool {
            let Some(region) = std::ptr::NonNull::new(ptr.cast()) else {
                return false;
            };
            // SAFETY: dlmalloc returns a region it mapped here and no longer uses.
            unsafe { nix::sys::mman::munmap(region, size).is_ok() }
        }

        fn can_release_part(&self, _flags: u32) -> bool {
            true
        }

        fn allocates_zeros(&self) -> bool {
            true
        }

        fn page_size(&self) -> usize {
            4096
        }
    }

    pub struct Heap(Mutex<Dl>);

    impl Heap {
        pub const fn new() -> Heap {
            Heap(Mutex::new(Dl(dlmalloc::Dlmalloc::new_with_allocator(
                Prefaulted,
            ))))
        }

        fn lock(&self) -> MutexGuard<'_, Dl> {
            // A panic never happens inside dlmalloc with the lock held (and the release binary
            // aborts on panic): the state behind a poisoned lock is whole.
            self.0.lock().unwrap_or_else(PoisonError::into_inner)
        }
    }

    // SAFETY: each call passes its arguments to the dlmalloc function of the same contract,
    // under the lock; std's mutex neither allocates nor re-enters the allocator.
    #[allow(unsafe_code)]
    unsafe impl GlobalAlloc for Heap {
        #[inline]
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            unsafe { self.lock().0.malloc(layout.size(), layout.align()) }
        }

        #[inline]
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            unsafe { self.lock().0.free(ptr, layout.size(), layout.align()) }
        }

        #[inline]
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            unsafe { self.lock().0.calloc(layout.size(), layout.align()) }
        }

        #[inline]
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            unsafe {
                self.lock()
                    .0
                    .realloc(ptr, layout.size(), layout.align(), new_size)
            }
        }
    }
}

/// aws-lc allocates through libc's `malloc` (musl's mallocng in the static binary), which maps
/// and unmaps a page pair around each signature check: 22 mmap/munmap pairs in a `check`. These
/// hooks give aws-lc's allocations to the binary's allocator instead, and keep what aws-lc's own
/// `OPENSSL_free` does: the freed block is zeroed (key material never lingers in freed memory).
pub mod crypto {
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
        let base = unsafe { crate::ALLOC.alloc(layout) };
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
            crate::ALLOC.dealloc(base, layout);
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
