//! The windows a quality evaluation decodes, each from an empty cache: the text cut into chunks of
//! the context, or, where the text is shorter than the windows asked for (the gate judging a
//! workload deeper than the text), windows whose cache is filled with the rest of the text, cycled,
//! before a segment held out of it, scored at the end: the cache is as full as the workload's, and
//! the scored tokens are not in it (a copy earlier in the window would let the model predict them
//! by looking back, whatever the cache's precision).

/// One window: its tokens (BOS first where the model adds one), the token each output predicts
/// (`None`: the text says nothing), and how many of its first positions only fill the cache.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    pub input: Vec<i32>,
    pub next: Vec<Option<i32>>,
    pub skip: usize,
}

/// The windows of `tokens` (the whole text) for a context of `n_ctx`: with `scored`, the last
/// `scored` positions of each are compared and `want` whole windows are asked for; without, every
/// position of every chunk of the first `max_tokens`.
pub fn windows(
    tokens: &[i32],
    bos: Option<i32>,
    n_ctx: usize,
    scored: Option<usize>,
    max_tokens: Option<usize>,
) -> Vec<Window> {
    let per_chunk = n_ctx.saturating_sub(usize::from(bos.is_some())).max(1);
    if let Some(s) = scored {
        let want = (max_tokens.unwrap_or(0) / n_ctx.max(1)).max(1);
        if tokens.len() < want * per_chunk && s < per_chunk {
            let held_out = held_out(tokens, bos, per_chunk, s, want);
            if !held_out.is_empty() {
                return held_out;
            }
        }
    }
    let text = &tokens[..max_tokens.map_or(tokens.len(), |m| m.min(tokens.len()))];
    let mut chunks: Vec<(usize, &[i32])> = (text.chunks(per_chunk).enumerate())
        .map(|(k, c)| (k * per_chunk, c))
        .collect();
    // Figures at a depth come from whole windows: a short last one would score shallow positions.
    if scored.is_some() && chunks.len() > 1 && chunks.last().is_some_and(|c| c.1.len() < per_chunk)
    {
        chunks.pop();
    }
    let offset = usize::from(bos.is_some());
    (chunks.into_iter())
        .map(|(start, chunk)| {
            let input: Vec<i32> = bos.into_iter().chain(chunk.iter().copied()).collect();
            // Output i predicts input i+1; the chunk's last output the next chunk's first token.
            let next = (0..input.len())
                .map(|i| text.get(start + i + 1 - offset).copied())
                .collect();
            Window {
                skip: skip(&input, scored),
                input,
                next,
            }
        })
        .collect()
}

/// The positions of `input` that only fill the cache when the last `scored` are compared.
fn skip(input: &[i32], scored: Option<usize>) -> usize {
    scored.map_or(0, |s| input.len().saturating_sub(s))
}

/// Up to `want` windows of `per_chunk` tokens (after BOS), each ending with its own segment of
/// `scored` tokens from the end of the text and filled before it with the text that precedes that
/// segment, preceded in turn by the text after it, over and over: the segment's natural context
/// leads into it, and it appears nowhere else in the window. None where the text is too short to
/// hold a segment out of it.
fn held_out(
    tokens: &[i32],
    bos: Option<i32>,
    per_chunk: usize,
    scored: usize,
    want: usize,
) -> Vec<Window> {
    let n = want.min((tokens.len() / scored.max(1)).saturating_sub(1));
    let fill = per_chunk - scored;
    (0..n)
        .map(|k| {
            let at = tokens.len() - (n - k) * scored;
            let segment = &tokens[at..at + scored];
            // What follows the segment, then what precedes it: cycled so that it ends right
            // before the segment.
            let rest: Vec<i32> = (tokens[at + scored..].iter())
                .chain(&tokens[..at])
                .copied()
                .collect();
            let filler = (0..fill).map(|i| {
                let from_end = (fill - i) % rest.len();
                rest[(rest.len() - from_end) % rest.len()]
            });
            let input: Vec<i32> = (bos.into_iter())
                .chain(filler)
                .chain(segment.iter().copied())
                .collect();
            let mut next: Vec<Option<i32>> = input[1..].iter().copied().map(Some).collect();
            next.push(tokens.get(at + scored).copied());
            Window {
                skip: skip(&input, Some(scored)),
                input,
                next,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_that_holds_the_windows_is_cut_into_chunks() {
        let text: Vec<i32> = (10..30).collect();
        let w = windows(&text, Some(1), 6, Some(2), Some(12));
        assert_eq!(w.len(), 2);
        assert_eq!(w[0].input, [1, 10, 11, 12, 13, 14]);
        assert_eq!(w[0].next[0], Some(10), "BOS predicts the first token");
        assert_eq!(
            w[0].next[5],
            Some(15),
            "the last predicts the next chunk's first"
        );
        assert_eq!(w[0].skip, 4);
        assert_eq!(w[1].input, [1, 15, 16, 17, 18, 19]);
        // Without `scored` every position of every chunk, a short last one too.
        let all = windows(&text, Some(1), 6, None, None);
        assert_eq!(all.len(), 4);
        assert_eq!(all[3].input, [1, 25, 26, 27, 28, 29]);
        assert_eq!(all[3].next[5], None);
    }

    #[test]
    fn a_window_deeper_than_the_text_is_filled_by_the_text_cycled_before_a_held_out_segment() {
        // 20 tokens of text, windows of 50 (after BOS), 4 positions scored, 2 windows.
        let text: Vec<i32> = (100..120).collect();
        let w = windows(&text, Some(1), 51, Some(4), Some(102));
        assert_eq!(w.len(), 2);
        for (k, win) in w.iter().enumerate() {
            assert_eq!(win.input.len(), 51, "as deep as asked");
            assert_eq!(win.input[0], 1);
            assert_eq!(win.skip, 47);
            let at = 20 - (2 - k) * 4;
            let segment = &text[at..at + 4];
            assert_eq!(
                &win.input[47..],
                segment,
                "the segment is scored at the end"
            );
            // It leads in with the text before it, and appears nowhere else.
            assert_eq!(win.input[46], text[at - 1]);
            assert!(win.input[1..47].iter().all(|t| !segment.contains(t)));
            // Every output predicts the next input; the last, what follows in the text.
            assert_eq!(win.next[10], Some(win.input[11]));
            assert_eq!(win.next[50], text.get(at + 4).copied());
        }
        assert_eq!(
            w[1].next[50], None,
            "the text's last segment: nothing follows"
        );
    }

    #[test]
    fn a_text_too_short_to_hold_a_segment_out_falls_back_to_chunks() {
        let text: Vec<i32> = (0..5).collect();
        let w = windows(&text, None, 64, Some(4), Some(128));
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].input, text);
    }
}
