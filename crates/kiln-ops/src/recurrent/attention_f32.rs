//! The fast path of `Attention` for the case the compiler's `attention` pass and the
//! com.microsoft expansions produce: f32, 3-D `[B, S, H*D]` Q, K and V with `H` heads each, an
//! optional f32 additive mask whose last dim is the total kv length, an optional `[B, H, P, D]`
//! cache (past key and value; the present ones are then built and returned), causal masking
//! (offset by the cache), no window masking or softcap, no QK output.
//!
//! Per (batch, head), in parallel over the pool: the scores `Q_h K_h^T` come from the GEMM with A read in place from Q
//! (leading dimension `H*D`, no head-split copy) and `K_h^T` packed straight from K's rows;
//! each score row is scaled, masked and exponentiated in place, left unnormalised (two
//! vectorised passes, `kiln_kernels::vector::softmax_unnormalized_row`); then `E V_h` is a
//! second GEMM with `V_h` packed from V's rows, each row scaled by its `1 / sum` as it is
//! copied into Y's head columns, so Y comes out as `[B, S, H*Dv]` with no transposes.
//! Rounding differs from the f64 reference by f32 accumulation only (the reference rounds the
//! scaled Q and K; this path scales the f32 scores), well within 1e-5 relative.

use super::attention::Attention;
use crate::error::{OpError, Result};
use crate::value::{Args, Value};
use kiln_kernels::gemm::MatLayout;
use kiln_kernels::recycle::lend;
use kiln_kernels::sgemm::{AMatrix, BLayout, Epilogue, PackedB, sgemm};
use kiln_tensor::{DType, Tensor};

kiln_kernels::scratch_kinds! {
    /// One (batch, head) score matrix (a run state's scratch, per thread).
    Scores: Vec<f32>;
    /// A head's `sq x dv` result before it is copied into Y.
    HeadOut: Vec<f32>;
    /// `1 / sum` of each unnormalised probability row of the task's block.
    InvSums: Vec<f32>;
}

impl Attention {
    /// Y for the fast case (see the module docs), `None` when the call is not of that kind.
    pub(super) fn eval_f32(&self, args: &Args<'_>) -> Result<Option<crate::Outputs>> {
        let (q, k, v) = (args.tensor(0)?, args.tensor(1)?, args.tensor(2)?);
        let mask = args.opt_tensor(3)?;
        let f32s = |t: &Tensor| t.dtype() == DType::F32;
        let (past_k, past_v) = (args.opt_tensor(4)?, args.opt_tensor(5)?);
        let simple = self.softcap == 0.0
            && self.left_window_size < 0
            && self.right_window_size < 0
            && self.softmax_precision.is_none_or(|d| d == DType::F32)
            && past_k.is_some() == past_v.is_some()
            && (6..8).all(|i| args.value(i).is_none())
            && !args.output_wanted(3)
            && f32s(q)
            && f32s(k)
            && f32s(v)
            && mask.is_none_or(f32s)
            && past_k.is_none_or(f32s)
            && past_v.is_none_or(f32s);
        let (Some(h), Some(hkv)) = (self.q_num_heads, self.kv_num_heads) else {
            return Ok(None);
        };
        let (&[b, sq, qw], &[kb, skv, kw], &[vb, vs, vw]) = (q.shape(), k.shape(), v.shape()) else {
            return Ok(None);
        };
        if !simple || h == 0 || hkv != h || kb != b || vb != b || vs != skv || qw % h != 0 || vw % h != 0 || kw != qw {
            return Ok(None);
        }
        let (d, dv) = (qw / h, vw / h);
        // The cache, `[B, H, P, D]` and `[B, H, P, Dv]`.
        let past = match (past_k, past_v) {
            (Some(pk), Some(pv)) => match (pk.shape(), pv.shape()) {
                (&[pb, ph, p, pd], &[vb2, vh, p2, pdv])
                    if pb == b && vb2 == b && ph == h && vh == h && p2 == p && pd == d && pdv == dv =>
                {
                    Some((pk.as_slice::<f32>()?, pv.as_slice::<f32>()?, p))
                }
                _ => return Ok(None),
            },
            _ => None,
        };
        let p = past.map_or(0, |x| x.2);
        // Keys attended: the cache's, then the new ones.
        let Some(t) = p.checked_add(skv) else { return Ok(None) };
        // Mask strides over [B, H, S_q] (0 where broadcast); its last dim must be T.
        let mstr = match mask {
            None => None,
            Some(m) => {
                let ms = m.shape();
                if ms.is_empty() || ms.len() > 4 || ms.last() != Some(&t) {
                    return Ok(None);
                }
                let target = [b, h, sq];
                let off = 4 - ms.len();
                let mut str3 = [0usize; 3];
                let mut acc = t;
                for i in (0..ms.len() - 1).rev() {
                    let tt = i + off;
                    let dim = ms[i];
                    if dim != 1 && target.get(tt) != Some(&dim) {
                        return Ok(None);
                    }
                    if dim != 1
                        && let Some(s) = str3.get_mut(tt)
                    {
                        *s = acc;
                    }
                    acc *= dim;
                }
                Some((m.as_slice::<f32>()?, str3))
            }
        };
        let scale = self.scale.unwrap_or(1.0 / (d as f32).sqrt());
        let (qd, kd, vd) = (q.as_slice::<f32>()?, k.as_slice::<f32>()?, v.as_slice::<f32>()?);
        let out_len = crate::util::checked_numel(&[b, sq, vw])?;
        crate::util::checked_numel(&[sq, t])?;
        // With a cache, or when they are read, the present K and V `[B, H, T, D]`: the cache's
        // rows then the new ones, and the heads read them there (row stride D); otherwise the
        // heads read K and V in place (row stride H*D).
        let present = if past.is_some() || args.output_wanted(1) || args.output_wanted(2) {
            let (pk, pv) = past.map_or((&[][..], &[][..]), |x| (x.0, x.1));
            Some((
                present_rows(pk, kd, b, h, p, skv, d)?,
                present_rows(pv, vd, b, h, p, skv, dv)?,
            ))
        } else {
            None
        };
        let (k_src, k_ld, v_src, v_ld) = match &present {
            Some((pk, pv)) => (&pk[..], d, &pv[..], dv),
            None => (kd, kw, vd, vw),
        };
        let k_at = |bi: usize, hi: usize| match present {
            Some(_) => (bi * h + hi) * t * d,
            None => bi * skv * kw + hi * d,
        };
        let v_at = |bi: usize, hi: usize| match present {
            Some(_) => (bi * h + hi) * t * dv,
            None => bi * skv * vw + hi * dv,
        };
        // Every element of Y is written (each head's columns of every row): no clearing.
        let mut y = crate::util::out_f32(out_len);
        let layout = BLayout::for_isa(kiln_kernels::isa::active());
        let (mdata, ms) = match mstr {
            Some((m, s)) => (Some(m), s),
            None => (None, [0; 3]),
        };
        // One task per (batch, head, block of query rows), over the pool: its scores and its
        // `rows x dv` result in per-thread buffers, the result copied into Y's head columns
        // under a lock. Query rows are split only when there are fewer heads than twice the
        // threads (ViT-tiny's 3 heads on 2 threads would leave one thread idle a third of the
        // time); the blocks of one head share its packed K^T and V, packed once by whichever
        // task gets there first.
        let heads = b * h;
        let threads = kiln_kernels::pool::current_threads().max(1);
        let qblocks = if heads >= 2 * threads {
            1
        } else {
            (2 * threads).div_ceil(heads.max(1)).min(sq.div_ceil(8)).max(1)
        };
        // Sub-blocks of query rows (see `sub_block_rows`) are cut at multiples of `sub` from
        // the first row, and the tasks' blocks too once there are sub-blocks: every product
        // then has the same rows on any number of threads, and so the same sums (the GEMM
        // blocks the depth differently for a few rows than for many).
        let sub = sub_block_rows(t);
        let mut qb = sq.div_ceil(qblocks).next_multiple_of(8).max(1);
        if sq > sub {
            qb = qb.next_multiple_of(sub);
        }
        let qblocks = sq.div_ceil(qb).max(1);
        // Shared packs only when a head is split (otherwise each task packs its own, and the
        // panels go back to the thread's spare lines for the next head).
        let shared = if qblocks > 1 { heads } else { 0 };
        let packs: smallvec::SmallVec<[std::sync::OnceLock<Option<(PackedB, PackedB)>>; 16]> =
            (0..shared).map(|_| std::sync::OnceLock::new()).collect();
        let y_cols = std::sync::Mutex::new(&mut y);
        let failed = std::sync::atomic::AtomicBool::new(false);
        kiln_kernels::pool::parallel_for(heads * qblocks, &|task| {
            // Block-major: tasks running at the same time take different heads, so one does
            // not wait for another to finish packing the head they share.
            let (blk, head) = (task / heads.max(1), task % heads.max(1));
            let (bi, hi) = (head / h, head % h);
            let (q0, rows) = (blk * qb, qb.min(sq.saturating_sub(blk * qb)));
            let (qo, ko, vo) = ((bi * sq + q0) * qw + hi * d, k_at(bi, hi), v_at(bi, hi));
            let (Some(qs), Some(ks), Some(vs_)) = (qd.get(qo..), k_src.get(ko..), v_src.get(vo..)) else {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
                return;
            };
            // K_h^T: element (e, j) at ks[j * k_ld + e]; V_h: element (j, e) at vs_[j * v_ld + e].
            let pack = || {
                let kt = PackedB::pack(layout, d, t, ks, MatLayout::transposed(k_ld)).ok()?;
                let vp = PackedB::pack(layout, t, dv, vs_, MatLayout::row_major(v_ld)).ok()?;
                Some((kt, vp))
            };
            let own;
            let packed = match packs.get(head) {
                Some(cell) => cell.get_or_init(pack),
                None => {
                    own = pack();
                    &own
                }
            };
            let Some((kt, vp)) = packed else {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
                return;
            };
            // The task's query rows in sub-blocks whose scores stay in L2 (long sequences'
            // score rows would otherwise go out to memory and come back for the softmax and
            // the second GEMM: Whisper's 1500 x 1500 per head is 9 MB).
            let sub = sub.min(rows.max(1));
            // The scores are overwritten whole by the GEMM: a reused per-thread buffer.
            let mut scores = lend::<Scores>();
            scores.resize(sub * t, 0.0);
            let mut out = lend::<HeadOut>();
            out.resize(sub * dv, 0.0);
            let mut inv = lend::<InvSums>();
            let mut s0 = 0;
            while s0 < rows {
                let n = sub.min(rows - s0);
                let (r0, scores) = (q0 + s0, &mut scores[..n * t]);
                let out = &mut out[..n * dv];
                let ok = qs.get(s0 * qw..).is_some_and(|a| {
                    sgemm(n, AMatrix::row_major(a, qw), kt.view(), scores, t, &Epilogue::NONE).is_ok()
                });
                // Unnormalised probabilities (scale and mask folded into their two passes); each
                // row's `1 / sum` scales its `dv` outputs on the copy into Y instead of its `skv`
                // probabilities. A row masked everywhere gives zeros (factor 0), as the reference.
                inv.clear();
                for (i, row) in scores.chunks_exact_mut(t.max(1)).enumerate() {
                    // Causal: query r0 + i sees the cache and the new keys up to itself.
                    let seen = if self.is_causal { (p + r0 + i + 1).min(t) } else { t };
                    let (row, hidden) = row.split_at_mut(seen);
                    hidden.fill(0.0);
                    let mrow = mdata.and_then(|m| {
                        let o = bi * ms[0] + hi * ms[1] + (r0 + i) * ms[2];
                        m.get(o..o + seen)
                    });
                    inv.push(kiln_kernels::vector::softmax_unnormalized_row(row, scale, mrow));
                }
                let ok = ok && sgemm(n, AMatrix::row_major(scores, t), vp.view(), out, dv, &Epilogue::NONE).is_ok();
                if !ok {
                    failed.store(true, std::sync::atomic::Ordering::Relaxed);
                    return;
                }
                let mut y = y_cols.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                kiln_kernels::simd::vectorize(|| {
                    for ((i, src), &f) in out.chunks_exact(dv.max(1)).enumerate().zip(inv.iter()) {
                        let o = (bi * sq + r0 + i) * vw + hi * dv;
                        if let Some(dst) = y.get_mut(o..o + dv) {
                            dst.iter_mut().zip(src).for_each(|(d, &v)| *d = v * f);
                        }
                    }
                });
                s0 += n;
            }
        });
        if failed.load(std::sync::atomic::Ordering::Relaxed) {
            // The shapes were checked above: a GEMM refusing them is a bug, named here.
            return Err(OpError::inputs(
                0,
                1,
                format!("Q and K that fit {h} heads"),
                q.shape(),
                k.shape(),
            ));
        }
        let y = Value::Tensor(Tensor::from_buf(smallvec::smallvec![b, sq, vw], y)?);
        Ok(Some(match present {
            None => smallvec::smallvec![y],
            Some((pk, pv)) => smallvec::smallvec![
                y,
                Value::Tensor(Tensor::from_buf(smallvec::smallvec![b, h, t, d], pk)?),
                Value::Tensor(Tensor::from_buf(smallvec::smallvec![b, h, t, dv], pv)?),
            ],
        }))
    }
}

/// Query rows per sub-block for `t` keys: their score rows (`rows x t` f32) at most about
/// 256 KB, so they stay in L2 between the GEMM that writes them, the softmax and the GEMM that
/// reads them, beside the head's packed K^T and V; a multiple of 8, at least 8. Measured on
/// Whisper-tiny's encoder (1500 keys, one thread): 64 KB of scores 1.10x the time of 256 KB,
/// 128 and 512 KB within 1%, 1 MB 1.06x, whole rows (9 MB) 1.11x.
fn sub_block_rows(t: usize) -> usize {
    const SCORE_BYTES: usize = 256 * 1024;
    (SCORE_BYTES / 4 / t.max(1) / 8 * 8).max(8)
}

/// The present cache `[B, H, P + S, D]`: per (batch, head) the `P` rows of `past` (`[B, H, P,
/// D]`, empty when `P` is 0), then the head's `D` columns of each of the `S` rows of `new`
/// (`[B, S, H*D]`).
fn present_rows(
    past: &[f32],
    new: &[f32],
    b: usize,
    h: usize,
    p: usize,
    s: usize,
    d: usize,
) -> Result<kiln_tensor::Buf<f32>> {
    let t = p + s;
    let mut out = crate::util::out_f32(crate::util::checked_numel(&[b, h, t, d])?);
    let bad = || OpError::input_shape(4, format!("a [{b}, {h}, {p}, {d}] cache"), &[past.len()]);
    for bi in 0..b {
        for hi in 0..h {
            let base = (bi * h + hi) * t * d;
            let dst = out.get_mut(base..base + t * d).ok_or_else(bad)?;
            let (old, fresh) = dst.split_at_mut(p * d);
            let from = (bi * h + hi) * p * d;
            old.copy_from_slice(past.get(from..from + p * d).ok_or_else(bad)?);
            for (j, row) in fresh.chunks_exact_mut(d.max(1)).enumerate() {
                let o = (bi * s + j) * h * d + hi * d;
                row.copy_from_slice(new.get(o..o + d).ok_or_else(bad)?);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attention(h: usize, scale: Option<f32>) -> Attention {
        Attention {
            is_causal: false,
            q_num_heads: Some(h),
            kv_num_heads: Some(h),
            scale,
            softcap: 0.0,
            qk_matmul_output_mode: 0,
            softmax_precision: None,
            left_window_size: -1,
            right_window_size: -1,
        }
    }

    fn values(shape: &[usize], seed: u32, f64s: bool) -> Value {
        let mut s = seed;
        let v: Vec<f32> = (0..shape.iter().product::<usize>())
            .map(|_| {
                s = s.wrapping_mul(1_103_515_245).wrapping_add(12345);
                ((s >> 8) % 2001) as f32 / 500.0 - 2.0
            })
            .collect();
        let t = if f64s {
            Tensor::from_vec(shape, v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>())
        } else {
            Tensor::from_vec(shape, v)
        };
        Value::Tensor(t.unwrap())
    }

    /// The f32 path (on 1 and 2 threads) against the f64 reference: no mask, and additive
    /// masks broadcast over batch, heads or query rows, one of them masking a row entirely.
    #[test]
    fn the_f32_path_matches_the_reference() {
        let pool = kiln_kernels::pool::ThreadPool::new(2).unwrap();
        let (b, sq, skv, h, d, dv) = (2, 5, 7, 3, 4, 6);
        for (case, mask_shape) in [
            None,
            Some(vec![skv]),
            Some(vec![b, 1, sq, skv]),
            Some(vec![1, h, 1, skv]),
        ]
        .into_iter()
        .enumerate()
        {
            let op = attention(h, (case % 2 == 0).then_some(0.3));
            let shapes = [vec![b, sq, h * d], vec![b, skv, h * d], vec![b, skv, h * dv]];
            let run = |f64s: bool| -> Vec<f64> {
                let mut vals: Vec<Option<Value>> = shapes
                    .iter()
                    .enumerate()
                    .map(|(i, s)| Some(values(s, 10 * case as u32 + i as u32, f64s)))
                    .collect();
                if let Some(ms) = &mask_shape {
                    let mut m = values(ms, 99, false).as_tensor().unwrap().to_f64_vec();
                    if ms.len() == 4 && ms[0] == b {
                        // Batch 1, query row 2: every key masked.
                        for j in 0..skv {
                            m[(sq + 2) * skv + j] = f64::NEG_INFINITY;
                        }
                    }
                    let t = if f64s {
                        Tensor::from_vec(ms.clone(), m).unwrap()
                    } else {
                        Tensor::from_vec(ms.clone(), m.iter().map(|&x| x as f32).collect::<Vec<_>>()).unwrap()
                    };
                    vals.push(Some(Value::Tensor(t)));
                }
                let ins: Vec<Option<&Value>> = vals.iter().map(Option::as_ref).collect();
                let args = Args::new(&ins).with_wanted(1);
                if !f64s {
                    assert!(op.eval_f32(&args).unwrap().is_some(), "case {case} takes the f32 path");
                    let two = pool.install(|| op.eval(&args).unwrap());
                    let one = op.eval(&args).unwrap();
                    assert_eq!(
                        one[0].as_tensor().unwrap().as_slice::<f32>().unwrap(),
                        two[0].as_tensor().unwrap().as_slice::<f32>().unwrap()
                    );
                }
                let y = op.eval(&args).unwrap();
                let t = y[0].as_tensor().unwrap();
                assert_eq!(t.shape(), &[b, sq, h * dv]);
                t.to_f64_vec()
            };
            let (fast, slow) = (run(false), run(true));
            for (i, (f, s)) in fast.iter().zip(&slow).enumerate() {
                assert!((f - s).abs() <= 1e-5 * (1.0 + s.abs()), "case {case} [{i}]: {f} vs {s}");
            }
            if case == 2 {
                let row = (sq + 2) * h * dv;
                assert!(fast[row..row + h * dv].iter().all(|&v| v == 0.0));
            }
        }
    }

    /// Q, K, V and a per-query-row mask `[1, 1, sq, skv]` (`heads` heads of `d` and `dv`),
    /// as f32 or f64 values.
    fn masked_qkv(heads: usize, sq: usize, skv: usize, d: usize, dv: usize, f64s: bool) -> Vec<Value> {
        vec![
            values(&[1, sq, heads * d], 1, f64s),
            values(&[1, skv, heads * d], 2, f64s),
            values(&[1, skv, heads * dv], 3, f64s),
            values(&[1, 1, sq, skv], 4, f64s),
        ]
    }

    /// `op` (`heads` heads) on [`masked_qkv`]'s values: the f32 path on 1 and 2 threads (the
    /// same values, `[1, sq, heads * dv]`), within 1e-5 relative of the f64 reference.
    fn one_and_two_threads_match_the_reference(op: &Attention, [heads, sq, skv, d, dv]: [usize; 5]) {
        let pool = kiln_kernels::pool::ThreadPool::new(2).unwrap();
        let run = |f64s: bool| masked_qkv(heads, sq, skv, d, dv, f64s);
        let (fast, slow) = (run(false), run(true));
        let fa: Vec<Option<&Value>> = fast.iter().map(Some).collect();
        let args = Args::new(&fa).with_wanted(1);
        assert!(op.eval_f32(&args).unwrap().is_some());
        let one = op.eval(&args).unwrap();
        let two = pool.install(|| op.eval(&args).unwrap());
        let sa: Vec<Option<&Value>> = slow.iter().map(Some).collect();
        let want = op.eval(&Args::new(&sa).with_wanted(1)).unwrap()[0]
            .as_tensor()
            .unwrap()
            .to_f64_vec();
        let (one, two) = (one[0].as_tensor().unwrap(), two[0].as_tensor().unwrap());
        assert_eq!(one.shape(), &[1, sq, heads * dv]);
        assert_eq!(one.as_slice::<f32>().unwrap(), two.as_slice::<f32>().unwrap());
        for (i, (f, s)) in one.to_f64_vec().iter().zip(&want).enumerate() {
            assert!((f - s).abs() <= 1e-5 * (1.0 + s.abs()), "{op:?} [{i}]: {f} vs {s}");
        }
    }

    /// One head on 2 threads: the query rows split into blocks that share the head's packed
    /// K^T and V; the same values as on one thread and as the f64 reference, with a mask per
    /// query row (so each block must read its own mask rows).
    #[test]
    fn query_blocks_of_one_head_match_one_thread_and_the_reference() {
        one_and_two_threads_match_the_reference(&attention(1, None), [1, 37, 29, 8, 5]);
    }

    /// Long key sequences: each task's query rows in L2-sized sub-blocks (2000 keys: 32 rows a
    /// sub-block, so 70 rows run as 32 + 32 + 6, on two threads as tasks of 64 and 6 rows),
    /// with a mask per query row and causal masking, both of which each sub-block must offset
    /// by its first row; on 1 and 2 threads (the same values) against the f64 reference.
    #[test]
    fn sub_blocks_of_query_rows_match_the_reference() {
        let (h, sq, skv, d, dv) = (2, 70, 2000, 8, 5);
        assert_eq!(sub_block_rows(skv), 32);
        for causal in [false, true] {
            let op = Attention {
                is_causal: causal,
                ..attention(h, None)
            };
            one_and_two_threads_match_the_reference(&op, [h, sq, skv, d, dv]);
        }
    }

    /// A decoding step: a `[B, H, P, D]` cache, causal masking offset by it, an additive mask
    /// over all `P + S` keys, and the present key and value read: Y and both caches as the f64
    /// reference gives them (the caches bit for bit), on 1 and 2 threads.
    #[test]
    fn cache_and_causal_masking_match_the_reference() {
        let pool = kiln_kernels::pool::ThreadPool::new(2).unwrap();
        let (b, sq, p, h, d, dv) = (2, 3, 4, 2, 4, 3);
        let t = p + sq;
        for causal in [false, true] {
            let op = Attention {
                is_causal: causal,
                ..attention(h, None)
            };
            let run = |f64s: bool| -> Vec<Value> {
                vec![
                    values(&[b, sq, h * d], 1, f64s),
                    values(&[b, sq, h * d], 2, f64s),
                    values(&[b, sq, h * dv], 3, f64s),
                    values(&[b, 1, 1, t], 4, f64s),
                    values(&[b, h, p, d], 5, f64s),
                    values(&[b, h, p, dv], 6, f64s),
                ]
            };
            let (fast, slow) = (run(false), run(true));
            let fa: Vec<Option<&Value>> = fast.iter().map(Some).collect();
            let sa: Vec<Option<&Value>> = slow.iter().map(Some).collect();
            let args = Args::new(&fa).with_wanted(7);
            assert!(op.eval_f32(&args).unwrap().is_some(), "causal {causal}");
            let one = op.eval(&args).unwrap();
            let two = pool.install(|| op.eval(&args).unwrap());
            let want = op.eval(&Args::new(&sa).with_wanted(7)).unwrap();
            let shapes: [&[usize]; 3] = [&[b, sq, h * dv], &[b, h, t, d], &[b, h, t, dv]];
            for (o, shape) in shapes.iter().enumerate() {
                let (x, y, w) = (
                    one[o].as_tensor().unwrap(),
                    two[o].as_tensor().unwrap(),
                    want[o].as_tensor().unwrap().to_f64_vec(),
                );
                assert_eq!(x.shape(), *shape, "output {o}");
                assert_eq!(x.as_slice::<f32>().unwrap(), y.as_slice::<f32>().unwrap());
                for (i, (f, s)) in x.to_f64_vec().iter().zip(&w).enumerate() {
                    let tol = if o == 0 { 1e-5 * (1.0 + s.abs()) } else { 0.0 };
                    assert!((f - s).abs() <= tol, "causal {causal} output {o} [{i}]: {f} vs {s}");
                }
            }
        }
    }

    #[test]
    fn other_calls_take_the_reference_path() {
        let h = 2;
        let (q, k, v) = (
            values(&[1, 3, 8], 1, false),
            values(&[1, 4, 8], 2, false),
            values(&[1, 4, 8], 3, false),
        );
        let ins = [Some(&q), Some(&k), Some(&v)];
        // The QK output, a softcap or a sliding window: not the f32 path.
        assert!(
            attention(h, None)
                .eval_f32(&Args::new(&ins).with_wanted(9))
                .unwrap()
                .is_none()
        );
        let capped = Attention {
            softcap: 5.0,
            ..attention(h, None)
        };
        assert!(capped.eval_f32(&Args::new(&ins).with_wanted(1)).unwrap().is_none());
        let windowed = Attention {
            left_window_size: 2,
            ..attention(h, None)
        };
        assert!(windowed.eval_f32(&Args::new(&ins).with_wanted(1)).unwrap().is_none());
        assert!(
            attention(h, None)
                .eval_f32(&Args::new(&ins).with_wanted(1))
                .unwrap()
                .is_some()
        );
    }
}
