/*
** gemm_fixture.h -- what the fixtures of test_gemm_providers export beside their entry points, so
** that the test can count their calls and steer them: it finds the symbol in the loaded module
** (dlopen of the same file, dlsym). The GEMM provider fixture (gemm_fixture.c) exports
** GEMM_FIXTURE_STATE, the format fixtures raw_factor.c RAW_FACTOR_COUNTS and pair_fixture.c
** PAIR_FIXTURE_STATE.
*/
#ifndef GEMM_FIXTURE_H
#define GEMM_FIXTURE_H

#define GEMM_FIXTURE_STATE "gemm_fixture"

/* gemm_fixture_state.mode */
#define GEMM_FIXTURE_RUN 0     /* run() computes the product */
#define GEMM_FIXTURE_DECLINE 1 /* run() declines every problem (HQ_ENOTSUP, nothing run) */
#define GEMM_FIXTURE_FAIL 2    /* run() fails (HQ_EDEVICE) */
#define GEMM_FIXTURE_PAIR 3    /* run() reads both operands through host->raw_pair (ABI 1.1) */
#define GEMM_FIXTURE_PAIR_BAD 4 /* run() asks raw_pair for B in F16 (refused) and returns that */
#define GEMM_FIXTURE_ROWS_BAD 5 /* run() asks raw_rows for an operand without row factors */
#define GEMM_FIXTURE_PAIR_FOLD 6 /* run() reads both through host->raw_pair_fold (ABI 1.3), each
                                    operand's factor folded into a product of its own */
#define GEMM_FIXTURE_PAIR_FOLD_BAD 7 /* ... with A's fold reading B's product (refused) */
#define GEMM_FIXTURE_PAIR_CHAIN 8 /* run() reads both through host->raw_pair_fold (ABI 1.4) with
                                     B's fold reading A's product: alpha * fa, then times fb */

typedef struct gemm_fixture_state {
  int accepts_calls; /* every accepts() */
  int runs;          /* products computed */
  int queries;       /* run() with HQ_GEMM_QUERY */
  int declines;      /* run() that declined or failed */
  int mode;          /* GEMM_FIXTURE_*, set by the test */
  int pairs;         /* raw_pair requests that succeeded */
  int rows;          /* raw_rows requests that succeeded (operands with per-row factors) */
  int folds;         /* ... of them, those whose dequantize folded the per-tensor factor */
  int pair_folds;    /* the folds raw_pair_fold made */
  float fold_a, fold_b; /* the last raw_pair_fold's two products (A's with alpha, B's alone) */
  int capturing;     /* hq_gemm_host_capturing() at the last run() that computed */
  int joint;         /* hq_gemm_host_joint() of the two operands at the last pair request */
} gemm_fixture_state;

#define RAW_FACTOR_COUNTS "raw_factor_fixture"

typedef struct raw_factor_counts {
  int deq_raw;  /* dequantize() with HQ_CALL_DEQ_RAW */
  int deq_full; /* dequantize() without it */
  int factor;   /* tensor_factor() */
} raw_factor_counts;

#define PAIR_FIXTURE_STATE "pair_fixture"

typedef struct pair_fixture_state {
  int deqs;    /* dequantize() calls, alone or within a pair */
  int pairs;   /* dequantize_pair() requests that made both */
  int decline; /* set by the test: dequantize_pair() declines (HQ_ENOTSUP) */
  int fail;    /* set by the test: dequantize_pair() fails (HQ_EDEVICE) */
} pair_fixture_state;

#endif
