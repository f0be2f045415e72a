//! aws-lc's big-number arithmetic, for the consistency check of an RSA key's private parts that
//! `renew --reuse-keys` makes before it carries a key into a new certificate
//! ([`crate::pki::PrivateKey::check_private_parts`]).
//!
//! aws-lc-rs checks a key only by loading it (`RSA_check_key`, constant-time, ~0.25 ms per
//! 2048-bit key here: a sixth of a `renew --reuse-keys`), and offers no big numbers; aws-lc's
//! own `BN_*` functions (linked through `aws-lc-sys`, the bindings aws-lc-rs uses) do the same
//! checks Go's `crypto/rsa` makes when a component loads the key in a few microseconds. No safe
//! API exists for them, hence the `unsafe` here, each call with its SAFETY note. Every number is
//! scrubbed when dropped (`BN_clear_free`): they are private key parts.

use aws_lc_sys::{BIGNUM, BN_CTX};
use std::ptr::NonNull;

/// A failed allocation in aws-lc (the only way these calls fail for valid inputs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfMemory;

/// An owned aws-lc `BIGNUM`, zeroed and freed when dropped.
pub struct Bn(NonNull<BIGNUM>);

impl Drop for Bn {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `BN_new`/`BN_bin2bn`, is owned by this value alone and
        // is freed once, here.
        #[allow(unsafe_code)]
        unsafe {
            aws_lc_sys::BN_clear_free(self.0.as_ptr())
        }
    }
}

/// A scratch context for aws-lc's multiplications and divisions.
pub struct Ctx(NonNull<BN_CTX>);

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `BN_CTX_new`, is owned by this value and freed once.
        #[allow(unsafe_code)]
        unsafe {
            aws_lc_sys::BN_CTX_free(self.0.as_ptr())
        }
    }
}

impl Ctx {
    pub fn new() -> Result<Ctx, OutOfMemory> {
        // SAFETY: no arguments; a null result is handled.
        #[allow(unsafe_code)]
        let ctx = unsafe { aws_lc_sys::BN_CTX_new() };
        NonNull::new(ctx).map(Ctx).ok_or(OutOfMemory)
    }
}

/// 1 for aws-lc's success return, `OutOfMemory` otherwise.
fn ok(ret: std::os::raw::c_int) -> Result<(), OutOfMemory> {
    if ret == 1 { Ok(()) } else { Err(OutOfMemory) }
}

impl Bn {
    /// A big-endian unsigned integer (leading zeros allowed).
    pub fn from_be(bytes: &[u8]) -> Result<Bn, OutOfMemory> {
        // SAFETY: `bytes` is valid for `len` bytes for the duration of the call; a null `ret`
        // asks aws-lc for a new BIGNUM, and a null result is handled.
        #[allow(unsafe_code)]
        let bn =
            unsafe { aws_lc_sys::BN_bin2bn(bytes.as_ptr(), bytes.len(), std::ptr::null_mut()) };
        NonNull::new(bn).map(Bn).ok_or(OutOfMemory)
    }

    fn zero() -> Result<Bn, OutOfMemory> {
        // SAFETY: no arguments; a null result is handled.
        #[allow(unsafe_code)]
        let bn = unsafe { aws_lc_sys::BN_new() };
        NonNull::new(bn).map(Bn).ok_or(OutOfMemory)
    }

    /// `a · b`.
    pub fn mul(a: &Bn, b: &Bn, ctx: &Ctx) -> Result<Bn, OutOfMemory> {
        let r = Bn::zero()?;
        // SAFETY: all pointers are live BIGNUMs/BN_CTX owned by the callers' values; `r` is a
        // distinct, exclusively owned output.
        #[allow(unsafe_code)]
        ok(unsafe {
            aws_lc_sys::BN_mul(r.0.as_ptr(), a.0.as_ptr(), b.0.as_ptr(), ctx.0.as_ptr())
        })?;
        Ok(r)
    }

    /// `a mod m`, in `[0, m)`; `m` must not be zero.
    pub fn rem(a: &Bn, m: &Bn, ctx: &Ctx) -> Result<Bn, OutOfMemory> {
        let r = Bn::zero()?;
        // SAFETY: as in `mul`; aws-lc refuses a zero divisor with an error, never a fault.
        #[allow(unsafe_code)]
        ok(unsafe {
            aws_lc_sys::BN_nnmod(r.0.as_ptr(), a.0.as_ptr(), m.0.as_ptr(), ctx.0.as_ptr())
        })?;
        Ok(r)
    }

    /// `a − 1` for `a ≥ 1`.
    pub fn minus_one(a: &Bn) -> Result<Bn, OutOfMemory> {
        let r = Bn::zero()?;
        // SAFETY: `r` and `a` are live, distinct BIGNUMs; `r` is exclusively owned here.
        #[allow(unsafe_code)]
        unsafe {
            if aws_lc_sys::BN_copy(r.0.as_ptr(), a.0.as_ptr()).is_null() {
                return Err(OutOfMemory);
            }
            ok(aws_lc_sys::BN_sub_word(r.0.as_ptr(), 1))?;
        }
        Ok(r)
    }

    /// The comparison of two numbers.
    pub fn cmp(&self, other: &Bn) -> std::cmp::Ordering {
        // SAFETY: both pointers are live BIGNUMs, only read.
        #[allow(unsafe_code)]
        let c = unsafe { aws_lc_sys::BN_cmp(self.0.as_ptr(), other.0.as_ptr()) };
        c.cmp(&0)
    }

    /// Whether the number is 1.
    pub fn is_one(&self) -> bool {
        // SAFETY: a live BIGNUM, only read.
        #[allow(unsafe_code)]
        let one = unsafe { aws_lc_sys::BN_is_one(self.0.as_ptr()) };
        one == 1
    }

    /// Whether the number is 0 or 1.
    pub fn at_most_one(&self) -> bool {
        // SAFETY: a live BIGNUM, only read.
        #[allow(unsafe_code)]
        let bits = unsafe { aws_lc_sys::BN_num_bits(self.0.as_ptr()) };
        bits <= 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cmp::Ordering;

    fn n(v: u64) -> Bn {
        Bn::from_be(&v.to_be_bytes()).unwrap()
    }

    #[test]
    fn arithmetic_agrees_with_machine_integers() {
        let ctx = Ctx::new().unwrap();
        let (a, b) = (n(0xfedc_ba98), n(0x1234_5677));
        assert_eq!(
            Bn::mul(&a, &b, &ctx)
                .unwrap()
                .cmp(&n(0xfedc_ba98 * 0x1234_5677)),
            Ordering::Equal
        );
        assert_eq!(
            Bn::rem(&a, &b, &ctx)
                .unwrap()
                .cmp(&n(0xfedc_ba98 % 0x1234_5677)),
            Ordering::Equal
        );
        assert_eq!(
            Bn::minus_one(&a).unwrap().cmp(&n(0xfedc_ba97)),
            Ordering::Equal
        );
        assert_eq!(a.cmp(&b), Ordering::Greater);
        assert_eq!(b.cmp(&a), Ordering::Less);
        assert!(n(1).is_one() && !n(0).is_one() && !n(2).is_one());
        assert!(n(0).at_most_one() && n(1).at_most_one() && !n(2).at_most_one());
        // Leading zeros do not change the value; a zero divisor is an error, not a fault.
        assert_eq!(
            Bn::from_be(&[0, 0, 0, 7]).unwrap().cmp(&n(7)),
            Ordering::Equal
        );
        assert!(Bn::rem(&a, &n(0), &ctx).is_err());
        // Beyond machine words: a 129-bit times a 64-bit number leaves no remainder by either.
        let big = Bn::from_be(&[[1u8].as_slice(), &[0u8; 15], &[1u8]].concat()).unwrap();
        let w = n(u64::MAX);
        let p = Bn::mul(&big, &w, &ctx).unwrap();
        assert!(Bn::rem(&p, &big, &ctx).unwrap().cmp(&n(0)) == Ordering::Equal);
        assert!(Bn::rem(&p, &w, &ctx).unwrap().cmp(&n(0)) == Ordering::Equal);
    }
}
