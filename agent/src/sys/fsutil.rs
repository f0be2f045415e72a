//! Reading and writing files under a node root, safely.
//!
//! certrotor inspects a node's filesystem mounted somewhere else (a host container sees the host
//! at `/.bottlerocket/rootfs`), so every path is resolved the way the node itself would see it:
//! absolute symlink targets are taken inside the root, and nothing may climb above the root.
//! Reads are bounded, so a multi-gigabyte file or a FIFO named like a certificate cannot stall
//! the agent. Writes are durable: temp file, fsync, rename, fsync of the folder.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// Symlink hops followed before giving up (Linux's own limit).
const MAX_SYMLINK_HOPS: usize = 40;

/// Why a file under the root could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// A symlink on the way leads outside the node root.
    OutsideRoot { path: String, target: String },
    /// Too many symlinks (a loop).
    SymlinkLoop { path: String },
    /// Not a regular file (a directory, FIFO, device).
    NotRegular { path: String, what: &'static str },
    /// Bigger than certrotor will read.
    TooLarge { path: String, size: u64, limit: u64 },
    /// The operating system refused.
    Io { path: String, source: io::Error },
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::OutsideRoot { path, target } => write!(
                f,
                "'{path}' is a symlink to '{target}', which is outside the node root; \
                 replace it with the file itself"
            ),
            ReadError::SymlinkLoop { path } => write!(f, "'{path}': too many levels of symlinks"),
            ReadError::NotRegular { path, what } => {
                write!(f, "'{path}' is {what}, not a regular file")
            }
            ReadError::TooLarge { path, size, limit } => write!(
                f,
                "'{path}' is {size} bytes, more than the {limit} bytes a certificate, key or \
                 kubeconfig can be; it was not read"
            ),
            ReadError::Io { path, source } => write!(f, "cannot read '{path}': {source}"),
        }
    }
}

impl std::error::Error for ReadError {}

/// Resolves `rel` (a path relative to `root`, or absolute as the node sees it) to a real path
/// inside `root`, following symlinks as the node would. Returns `Ok(None)` when it does not
/// exist.
pub fn resolve_in_root(root: &Path, rel: &str) -> Result<Option<PathBuf>, ReadError> {
    if let Some(found) = resolve_beneath(root, rel) {
        return Ok(found);
    }
    let mut pending: Vec<String> = Vec::new();
    push_components(&mut pending, rel);
    pending.reverse();
    let mut resolved: Vec<String> = Vec::new();
    let mut hops = 0;
    while let Some(part) = pending.pop() {
        match part.as_str() {
            "." => continue,
            ".." => {
                if resolved.pop().is_none() {
                    return Err(ReadError::OutsideRoot {
                        path: rel.into(),
                        target: "..".into(),
                    });
                }
                continue;
            }
            _ => {}
        }
        let candidate = join(root, &resolved).join(&part);
        let meta = match fs::symlink_metadata(&candidate) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(ReadError::Io {
                    path: rel.into(),
                    source: e,
                });
            }
        };
        if meta.file_type().is_symlink() {
            hops += 1;
            if hops > MAX_SYMLINK_HOPS {
                return Err(ReadError::SymlinkLoop { path: rel.into() });
            }
            let mut more = follow_link(root, rel, &candidate, &mut resolved)?;
            more.reverse();
            pending.extend(more);
        } else {
            resolved.push(part);
        }
    }
    Ok(Some(join(root, &resolved)))
}

/// One symlink met by [`resolve_in_root`]: the components of its target, in order, to resolve
/// next (an absolute target restarts from the root, so `resolved` is cleared). Refuses a target
/// outside the root: an absolute one naming the root's real location on the host, or `..`
/// steps climbing above it.
fn follow_link(
    root: &Path,
    rel: &str,
    candidate: &Path,
    resolved: &mut Vec<String>,
) -> Result<Vec<String>, ReadError> {
    let target = fs::read_link(candidate).map_err(|e| ReadError::Io {
        path: rel.into(),
        source: e,
    })?;
    let target_text = target.to_string_lossy().to_string();
    let mut more = Vec::new();
    if target.is_absolute() {
        // The node sees absolute targets from its own root. A target that names the
        // real location of the root itself (a link made on the host) is outside it.
        if root != Path::new("/") && !Path::new(&target_text).starts_with(root) {
            let inside = root.join(target_text.trim_start_matches('/'));
            if fs::symlink_metadata(&inside).is_err() && Path::new(&target_text).exists() {
                return Err(ReadError::OutsideRoot {
                    path: rel.into(),
                    target: target_text,
                });
            }
        }
        resolved.clear();
        push_components(&mut more, &target_text);
    } else {
        push_components(&mut more, &target_text);
    }
    // Check that relative `..` steps in the target do not climb above the root.
    let mut depth = resolved.len() as i64;
    for c in &more {
        match c.as_str() {
            ".." => depth -= 1,
            "." => {}
            _ => depth += 1,
        }
        if depth < 0 {
            return Err(ReadError::OutsideRoot {
                path: rel.into(),
                target: target_text,
            });
        }
    }
    Ok(more)
}

/// Where a write to `rel` must land: the same real path a read of `rel` resolves to, relative
/// to the root (symlinks followed inside the root, absolute targets re-rooted, never above the
/// root). For a file that does not exist yet, its nearest existing folder is resolved and the
/// rest appended. Errors when the path leaves the root.
pub fn resolve_for_write(root: &Path, rel: &str) -> Result<String, ReadError> {
    let mut parts: Vec<String> = Vec::new();
    push_components(&mut parts, rel);
    let mut tail: Vec<String> = Vec::new();
    loop {
        let head = parts.join("/");
        let found = if parts.is_empty() {
            Some(root.to_path_buf())
        } else {
            resolve_in_root(root, &head)?
        };
        if let Some(real) = found {
            let mut out = real
                .strip_prefix(root)
                .map(Path::to_path_buf)
                .map_err(|_| ReadError::OutsideRoot {
                    path: rel.into(),
                    target: real.display().to_string(),
                })?;
            for t in tail.iter().rev() {
                out.push(t);
            }
            return Ok(out.to_string_lossy().to_string());
        }
        match parts.pop() {
            Some(last) => tail.push(last),
            None => return Ok(rel.trim_start_matches('/').to_string()),
        }
    }
}

fn push_components(out: &mut Vec<String>, path: &str) {
    for c in Path::new(path).components() {
        match c {
            Component::Normal(s) => out.push(s.to_string_lossy().to_string()),
            Component::ParentDir => out.push("..".into()),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
}

fn join(root: &Path, parts: &[String]) -> PathBuf {
    let mut p = root.to_path_buf();
    for part in parts {
        p.push(part);
    }
    p
}

/// Reads a regular file under the root, at most `limit` bytes. `Ok(None)` when absent.
pub fn read_in_root(root: &Path, rel: &str, limit: u64) -> Result<Option<Vec<u8>>, ReadError> {
    read_in_root_with_mode(root, rel, limit).map(|read| read.map(|(bytes, _)| bytes))
}

/// A file's bytes and permission bits (`0o7777`); `None` when it does not exist.
pub type ReadWithMode = Option<(Vec<u8>, u32)>;

/// [`read_in_root`], with the file's permission bits.
pub fn read_in_root_with_mode(
    root: &Path,
    rel: &str,
    limit: u64,
) -> Result<ReadWithMode, ReadError> {
    if let Some(read) = read_beneath(root, rel, limit) {
        return read;
    }
    let Some(path) = resolve_in_root(root, rel)? else {
        return Ok(None);
    };
    let looked = checked_meta(fs::metadata(&path), rel, limit)?;
    let (file, meta) = reopen_checked(open_nonblocking(&path), &looked, rel, limit)?;
    let bytes = read_bounded(file, rel, limit, meta.len())?;
    Ok(Some((bytes, meta.permissions().mode() & 0o7777)))
}

/// Opens `path` for reading without blocking: a FIFO swapped in after the file was examined
/// opens at once (and is then refused by [`reopen_checked`]) instead of waiting for a writer.
fn open_nonblocking(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)
}

/// The file opened after it was examined (`looked`): it must be that very file (same device
/// and inode), still a regular file within the limit. What the name pointed to may have been
/// swapped between the look and the open; what was opened is what counts.
fn reopen_checked(
    opened: io::Result<File>,
    looked: &fs::Metadata,
    label: &str,
    limit: u64,
) -> Result<(File, fs::Metadata), ReadError> {
    let file = opened.map_err(|e| ReadError::Io {
        path: label.into(),
        source: e,
    })?;
    let meta = checked_meta(file.metadata(), label, limit)?;
    if meta.dev() != looked.dev() || meta.ino() != looked.ino() {
        return Err(ReadError::Io {
            path: label.into(),
            source: io::Error::other("it was replaced while being read; run again"),
        });
    }
    Ok((file, meta))
}

thread_local! {
    /// The root folder opened once for a run of reads ([`with_pinned_root`]).
    static PINNED_ROOT: std::cell::RefCell<Option<(PathBuf, std::rc::Rc<std::os::fd::OwnedFd>)>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `f` with the root folder opened once for its reads under `root` on this thread (an
/// inventory reads ~30 files: each read otherwise opens and closes the root again). The reads
/// resolve beneath the folder as it was when `f` started; errors opening it leave the reads to
/// open it themselves.
pub fn with_pinned_root<R>(root: &Path, f: impl FnOnce() -> R) -> R {
    use nix::fcntl::{OFlag, open};
    let fd = open(
        root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    );
    let Ok(fd) = fd else { return f() };
    let previous = PINNED_ROOT.replace(Some((root.to_path_buf(), std::rc::Rc::new(fd))));
    // Restored even if `f` unwinds (tests; the binary aborts on panic).
    struct Restore(Option<(PathBuf, std::rc::Rc<std::os::fd::OwnedFd>)>);
    impl Drop for Restore {
        fn drop(&mut self) {
            PINNED_ROOT.set(self.0.take());
        }
    }
    let _restore = Restore(previous);
    f()
}

/// The common case of [`read_in_root_with_mode`] in a few system calls: a path with no symlink
/// and no `..`, which the kernel opens beneath the root and refuses at the first symlink
/// (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`), so it names the same file the
/// step-by-step resolution would. The file is examined before it is opened for reading, so a
/// FIFO or device named like a certificate is never opened: first by name (`fstatat`, no
/// symlink followed at the end, no automount), and when that finds a regular file within the
/// limit, it is opened at once; anything else is looked at again as an `O_PATH` open beneath the
/// root, which words the answer. (`fstatat` may follow a symlink or `..` on the way, even out
/// of the root: the open that follows refuses those, so such a path still takes the step-by-step
/// resolution. One look by name saves an `O_PATH` open and its close per file: 2 of the 6
/// system calls of each of a `check`'s ~27 reads.) `None` when the fast path does not apply (a
/// symlink or `..` on the way, a kernel without `openat2`, any error): the caller resolves step
/// by step, which also words the errors.
fn read_beneath(root: &Path, rel: &str, limit: u64) -> Option<Result<ReadWithMode, ReadError>> {
    use nix::errno::Errno;
    use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag, openat2};
    use nix::sys::stat::{SFlag, fstatat};
    let rel_path = rel.trim_start_matches('/');
    if rel_path.is_empty() {
        return None;
    }
    let dir = root_fd(root)?;
    let dir = dir.as_ref();
    // openat2 refuses flags that do not apply (O_NOCTTY with O_PATH) with EINVAL.
    let how = |flags| {
        OpenHow::new()
            .flags(flags | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS)
    };
    let look = AtFlags::AT_SYMLINK_NOFOLLOW | AtFlags::AT_NO_AUTOMOUNT;
    // Opened without blocking, and examined again once open: a FIFO swapped in after the look
    // opens at once and is refused (issue 30.9).
    let read = OFlag::O_RDONLY | OFlag::O_NOCTTY | OFlag::O_NONBLOCK;
    if let Ok(st) = fstatat(dir, rel_path, look) {
        let regular =
            SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFREG;
        if let Ok(size) = u64::try_from(st.st_size)
            && regular
            && size <= limit
        {
            let file = File::from(openat2(dir, rel_path, how(read)).ok()?);
            let meta = match checked_meta(file.metadata(), rel, limit) {
                Ok(m) if m.dev() == st.st_dev && m.ino() == st.st_ino => m,
                Ok(_) => return None,
                Err(e) => return Some(Err(e)),
            };
            let mode = meta.permissions().mode() & 0o7777;
            return Some(
                read_bounded(file, rel, limit, meta.len()).map(|bytes| Some((bytes, mode))),
            );
        }
    }
    let path_fd = match openat2(dir, rel_path, how(OFlag::O_PATH)) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Some(Ok(None)),
        Err(_) => return None,
    };
    let looked = match checked_meta(File::from(path_fd).metadata(), rel, limit) {
        Ok(meta) => meta,
        Err(e) => return Some(Err(e)),
    };
    let opened = openat2(dir, rel_path, how(read))
        .map(File::from)
        .map_err(io::Error::from);
    let (file, meta) = match reopen_checked(opened, &looked, rel, limit) {
        Ok(x) => x,
        Err(e) => return Some(Err(e)),
    };
    let mode = meta.permissions().mode() & 0o7777;
    Some(read_bounded(file, rel, limit, meta.len()).map(|bytes| Some((bytes, mode))))
}

/// The root folder, opened `O_PATH`: the pinned one ([`with_pinned_root`]) or opened now.
fn root_fd(root: &Path) -> Option<std::rc::Rc<std::os::fd::OwnedFd>> {
    use nix::fcntl::{OFlag, open};
    let pinned = PINNED_ROOT.with_borrow(|p| {
        p.as_ref()
            .filter(|(path, _)| path == root)
            .map(|(_, fd)| std::rc::Rc::clone(fd))
    });
    match pinned {
        Some(fd) => Some(fd),
        None => open(
            root,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .ok()
        .map(std::rc::Rc::new),
    }
}

/// The common case of [`resolve_in_root`] in one system call: a path of plain names (no `.`,
/// `..` or empty step) that the kernel finds beneath the root with no symlink on the way
/// (`openat2` `O_PATH` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`) is its own real path; one it
/// does not find (ENOENT before any symlink) does not exist. `None` when the fast path does not
/// apply (a symlink on the way: ELOOP; anything else): the caller walks step by step.
fn resolve_beneath(root: &Path, rel: &str) -> Option<Option<PathBuf>> {
    use nix::errno::Errno;
    use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
    let rel_path = rel.trim_start_matches('/');
    if rel_path.is_empty()
        || rel_path
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return None;
    }
    let dir = root_fd(root)?;
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
    match openat2(dir.as_ref(), rel_path, how) {
        Ok(_fd) => Some(Some(root.join(rel_path))),
        Err(Errno::ENOENT) => Some(None),
        Err(_) => None,
    }
}

/// The metadata of a file about to be read: a regular file of at most `limit` bytes.
fn checked_meta(
    meta: io::Result<fs::Metadata>,
    label: &str,
    limit: u64,
) -> Result<fs::Metadata, ReadError> {
    let meta = meta.map_err(|e| ReadError::Io {
        path: label.into(),
        source: e,
    })?;
    let ft = meta.file_type();
    if !ft.is_file() {
        let what = if ft.is_dir() {
            "a directory"
        } else {
            "a special file"
        };
        return Err(ReadError::NotRegular {
            path: label.into(),
            what,
        });
    }
    if meta.len() > limit {
        return Err(ReadError::TooLarge {
            path: label.into(),
            size: meta.len(),
            limit,
        });
    }
    Ok(meta)
}

/// Reads an open regular file of `size` bytes when examined, at most `limit` bytes (it may have
/// grown since).
fn read_bounded(file: File, label: &str, limit: u64, size: u64) -> Result<Vec<u8>, ReadError> {
    let io_err = |e| ReadError::Io {
        path: label.into(),
        source: e,
    };
    // One read of the size `fstat` gave plus a byte: a regular file that returns exactly its
    // size to it is at its end, so the read of 0 bytes that `read_to_end` needs to see the end
    // is saved (one system call per file, ~30 in a `check`). A file that grew or shrank
    // meanwhile is read on to its end, bounded as before.
    let want = size.min(limit) as usize;
    let mut buf = vec![0; want + 1];
    let mut file = file.take(limit + 1);
    let n = loop {
        match file.read(&mut buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => break other.map_err(io_err)?,
        }
    };
    buf.truncate(n);
    if n as u64 != size {
        file.read_to_end(&mut buf).map_err(io_err)?;
    }
    if buf.len() as u64 > limit {
        return Err(ReadError::TooLarge {
            path: label.into(),
            size: buf.len() as u64,
            limit,
        });
    }
    Ok(buf)
}

/// Reads a regular file, refusing non-regular files and files over `limit` bytes.
pub fn read_limited(path: &Path, label: &str, limit: u64) -> Result<Vec<u8>, ReadError> {
    let looked = checked_meta(fs::metadata(path), label, limit)?;
    let (file, meta) = reopen_checked(open_nonblocking(path), &looked, label, limit)?;
    read_bounded(file, label, limit, meta.len())
}

mod write;
pub use write::{
    FileMeta, SyncBatch, copy_durable, create_dir_all_mode, sync_dir, write_atomic, write_new,
    write_new_unsynced,
};
#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::tmpdir::TmpDir;
    use std::collections::BTreeSet;
    use std::os::unix::fs::symlink;

    fn tmp(name: &str) -> TmpDir {
        TmpDir::new("fsutil", name)
    }

    #[test]
    fn a_sync_batch_syncs_every_item_or_names_the_one_that_failed() {
        let d = tmp("syncall");
        let files: Vec<(PathBuf, File)> = (0..12)
            .map(|i| {
                let path = d.join(format!("f{i}"));
                let file = write_new_unsynced(&path, b"data", 0o600, None).unwrap();
                (path, file)
            })
            .collect();
        let mut batch = SyncBatch {
            files,
            dirs: BTreeSet::from([d.to_path_buf()]),
        };
        batch.sync().unwrap();
        let missing = d.join("missing");
        batch.dirs.insert(missing.clone());
        let (path, err) = batch.sync().unwrap_err();
        assert_eq!(path, missing);
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn symlinks_resolve_inside_the_root() {
        let root = tmp("links");
        fs::create_dir_all(root.join("var/lib/kubelet/pki")).unwrap();
        fs::write(root.join("var/lib/kubelet/pki/real.pem"), "x").unwrap();
        // An absolute link, as the kubelet makes it, is read inside the root.
        symlink(
            "/var/lib/kubelet/pki/real.pem",
            root.join("var/lib/kubelet/pki/current.pem"),
        )
        .unwrap();
        let got = resolve_in_root(&root, "var/lib/kubelet/pki/current.pem")
            .unwrap()
            .unwrap();
        assert_eq!(got, root.join("var/lib/kubelet/pki/real.pem"));
        // A relative link that climbs out is refused.
        symlink("../../../../../../../../etc/hostname", root.join("escape")).unwrap();
        assert!(matches!(
            resolve_in_root(&root, "escape"),
            Err(ReadError::OutsideRoot { .. })
        ));
        // An absolute link to a real file outside the root is refused.
        let outside = tmp("links-outside");
        fs::write(outside.join("f.crt"), "x").unwrap();
        symlink(outside.join("f.crt"), root.join("out.crt")).unwrap();
        assert!(matches!(
            resolve_in_root(&root, "out.crt"),
            Err(ReadError::OutsideRoot { .. })
        ));
        // A loop is reported.
        symlink("loop-b", root.join("loop-a")).unwrap();
        symlink("loop-a", root.join("loop-b")).unwrap();
        assert!(matches!(
            resolve_in_root(&root, "loop-a"),
            Err(ReadError::SymlinkLoop { .. })
        ));
        assert!(resolve_in_root(&root, "absent").unwrap().is_none());
    }

    #[test]
    fn reads_are_bounded_and_regular_only() {
        let root = tmp("reads");
        let big = File::create(root.join("big.crt")).unwrap();
        big.set_len(5 * 1024 * 1024 * 1024).unwrap(); // sparse 5 GiB
        assert!(matches!(
            read_in_root(&root, "big.crt", 1024),
            Err(ReadError::TooLarge { .. })
        ));
        fs::create_dir(root.join("dir.crt")).unwrap();
        assert!(matches!(
            read_in_root(&root, "dir.crt", 1024),
            Err(ReadError::NotRegular { .. })
        ));
        fs::write(root.join("ok"), "hello").unwrap();
        assert_eq!(read_in_root(&root, "ok", 1024).unwrap().unwrap(), b"hello");
    }

    /// The fast read's look by name (`fstatat`) follows symlinks and `..` on the host; what it
    /// finds there must never be what is read.
    #[test]
    fn reads_resolve_inside_the_root_whatever_the_look_by_name_finds() {
        let root = tmp("read-links");
        let outside = tmp("read-links-outside");
        // A decoy where an absolute link points on the host, and the file the link names
        // inside the root.
        fs::write(outside.join("f.crt"), "host").unwrap();
        let inside = root.join(outside.strip_prefix("/").unwrap());
        fs::create_dir_all(&inside).unwrap();
        fs::write(inside.join("f.crt"), "root").unwrap();
        symlink(&outside, root.join("pki")).unwrap();
        assert_eq!(
            read_in_root(&root, "pki/f.crt", 1024).unwrap().unwrap(),
            b"root"
        );
        // `..` out of the root names the host's file to fstatat: refused, not read.
        let up = format!(
            "../{}/f.crt",
            outside.file_name().unwrap().to_str().unwrap()
        );
        assert!(read_in_root(&root, &up, 1024).is_err());
        // A FIFO is refused without being opened (opening it would block).
        nix::unistd::mkfifo(&root.join("fifo.crt"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(matches!(
            read_in_root(&root, "fifo.crt", 1024),
            Err(ReadError::NotRegular { .. })
        ));
        // The permission bits come with the bytes.
        fs::write(root.join("k.key"), "k").unwrap();
        fs::set_permissions(root.join("k.key"), fs::Permissions::from_mode(0o640)).unwrap();
        let (bytes, mode) = read_in_root_with_mode(&root, "k.key", 1024)
            .unwrap()
            .unwrap();
        assert_eq!((bytes.as_slice(), mode), (&b"k"[..], 0o640));
    }

    #[test]
    fn new_files_get_the_exact_mode() {
        let root = tmp("modes");
        write_new(&root.join("k"), b"secret", 0o600, None).unwrap();
        assert_eq!(FileMeta::of(&root.join("k")).unwrap().mode, 0o600);
        assert!(write_new(&root.join("k"), b"again", 0o600, None).is_err());
    }
}
