//! Table lookups of 8-bit values: `y[i] = table[x[i]]` with a 256-entry table, the form a
//! quantized elementwise function takes (any function of one 8-bit input has 256 outputs).
//! On AVX-512 VBMI a 64-byte vector of indices looks up a byte table in four registers with
//! two `vpermi2b` (each selects from 128 bytes by the low seven bits) and a blend on the top
//! bit; elsewhere, and for wider entries, a plain loop.

use crate::isa::Isa;

/// `y[i] = table[x[i]]` over `min(x.len(), y.len())` bytes, on `isa`'s kernel (VBMI when
/// [`Isa::has_byte_permute`], else the portable loop; the same bytes either way).
pub fn lookup_bytes(isa: Isa, x: &[u8], table: &[u8; 256], y: &mut [u8]) {
    let n = x.len().min(y.len());
    let (x, y) = (x.get(..n).unwrap_or_default(), y.get_mut(..n).unwrap_or_default());
    #[cfg(target_arch = "x86_64")]
    if isa.has_byte_permute() {
        // SAFETY: `has_byte_permute` checked AVX-512 F, BW and VBMI; both slices hold `n`
        // bytes, the kernel's only reads and writes.
        unsafe { lookup_vbmi(x, table, y) };
        return;
    }
    let _ = isa;
    lookup(x, table, y);
}

/// `y[i] = table[x[i]]` over `min(x.len(), y.len())` entries of any type: the portable loop.
pub fn lookup<T: Copy>(x: &[u8], table: &[T; 256], y: &mut [T]) {
    for (o, &i) in y.iter_mut().zip(x) {
        *o = table[usize::from(i)];
    }
}

/// # Safety
/// AVX-512 F, BW and VBMI are available; `x` and `y` have the same length.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn lookup_vbmi(x: &[u8], table: &[u8; 256], y: &mut [u8]) {
    use std::arch::x86_64::*;
    let n = x.len().min(y.len());
    let t = table.as_ptr();
    // SAFETY: the table's 256 bytes are four 64-byte loads; each loop step reads and writes
    // 64 bytes at `i + 64 <= n`, the tail masked to its `n - i` bytes.
    unsafe {
        let (t0, t1) = (_mm512_loadu_si512(t.cast()), _mm512_loadu_si512(t.add(64).cast()));
        let (t2, t3) = (
            _mm512_loadu_si512(t.add(128).cast()),
            _mm512_loadu_si512(t.add(192).cast()),
        );
        let look = |idx: __m512i| {
            // Bits 0-5 pick a byte, bit 6 the first or second register of a pair, bit 7 the
            // pair.
            let low = _mm512_permutex2var_epi8(t0, idx, t1);
            let high = _mm512_permutex2var_epi8(t2, idx, t3);
            _mm512_mask_blend_epi8(_mm512_movepi8_mask(idx), low, high)
        };
        let mut i = 0;
        while i + 64 <= n {
            let v = look(_mm512_loadu_si512(x.as_ptr().add(i).cast()));
            _mm512_storeu_si512(y.as_mut_ptr().add(i).cast(), v);
            i += 64;
        }
        if i < n {
            let m: __mmask64 = (1u64 << (n - i)) - 1;
            let v = look(_mm512_maskz_loadu_epi8(m, x.as_ptr().add(i).cast()));
            _mm512_mask_storeu_epi8(y.as_mut_ptr().add(i).cast(), m, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Every level's bytes are the portable loop's, at lengths around the vector width.
        #[test]
        fn byte_lookups_match_the_loop(seed in any::<u64>(), n in prop_oneof![0usize..200, 1000usize..1100]) {
            let mut s = seed;
            let mut next = || { s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (s >> 33) as u8 };
            let table: [u8; 256] = std::array::from_fn(|_| next());
            let x: Vec<u8> = (0..n).map(|_| next()).collect();
            let mut want = vec![0u8; n];
            lookup(&x, &table, &mut want);
            for (i, (&w, &xi)) in want.iter().zip(&x).enumerate() {
                prop_assert_eq!(w, table[usize::from(xi)], "element {}", i);
            }
            for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
                let mut y = vec![0xA5u8; n + 3];
                lookup_bytes(isa, &x, &table, &mut y[..n]);
                prop_assert_eq!(&y[..n], &want[..], "{:?}", isa);
                prop_assert_eq!(&y[n..], &[0xA5u8; 3][..], "{:?} wrote past the end", isa);
            }
        }
    }
}
