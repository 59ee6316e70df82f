/* Row sums of a 4096x4096 float matrix three ways (see docs/performance.md, "Measurements of 2026-12-04
   evening"): one accumulator, 4 accumulators over 4 chunks 256 floats apart in each 1024-float block
   (tailjit before 7952d43), 4 accumulators over consecutive vectors (after).  Best of 11, ms; "L1"
   sums one row 4096 times, "dram" every row once:

     gcc -O2 -fvect-cost-model=dynamic -march=native -mprefer-vector-width=512 -fopenmp \
         docs/scripts/row_sum_streams.c -o /tmp/row_sum_streams && /tmp/row_sum_streams
*/
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define N 4096
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
__attribute__((noinline)) void single(const float *restrict x, float *restrict out, int64_t rs) {
  for (int64_t i = 0; i < N; ++i) { double acc = 0;
    for (int64_t blk = 0; blk < N; blk += 1024) { float a0=0;
      #pragma omp simd reduction(+:a0)
      for (int64_t r = 0; r < 1024; ++r) { a0 += x[i*rs+blk+r]; }
      acc += (double)a0; }
    out[i] = acc; } }
__attribute__((noinline)) void chunked(const float *restrict x, float *restrict out, int64_t rs) {
  for (int64_t i = 0; i < N; ++i) { double acc = 0;
    for (int64_t blk = 0; blk < N; blk += 1024) { float a0=0,a1=0,a2=0,a3=0; const int64_t c = 256;
      #pragma omp simd reduction(+:a0,a1,a2,a3)
      for (int64_t r = 0; r < c; ++r) { a0 += x[i*rs+blk+r]; a1 += x[i*rs+blk+c+r]; a2 += x[i*rs+blk+2*c+r]; a3 += x[i*rs+blk+3*c+r]; }
      acc += (double)(a0+a1+a2+a3); }
    out[i] = acc; } }
__attribute__((noinline)) void lanes(const float *restrict x, float *restrict out, int64_t rs) {
  for (int64_t i = 0; i < N; ++i) { double acc = 0;
    for (int64_t blk = 0; blk < N; blk += 1024) {
      float a0[16]={0},a1[16]={0},a2[16]={0},a3[16]={0};
      for (int64_t g = 0; g < 1024; g += 64) {
        #pragma omp simd
        for (int64_t l = 0; l < 16; ++l) { a0[l] += x[i*rs+blk+g+l]; a1[l] += x[i*rs+blk+g+16+l]; a2[l] += x[i*rs+blk+g+32+l]; a3[l] += x[i*rs+blk+g+48+l]; }
      }
      float s = 0;
      #pragma omp simd reduction(+:s)
      for (int l = 0; l < 16; ++l) s += (a0[l] + a1[l]) + (a2[l] + a3[l]);
      acc += (double)s; }
    out[i] = acc; } }
typedef void (*F)(const float *, float *, int64_t);
int main(void) {
  float *x = aligned_alloc(64, sizeof(float) * N * N), *o = malloc(sizeof(float) * N);
  for (int64_t i = 0; i < (int64_t)N * N; i++) x[i] = (float)(i % 7) * 0.1f;
  F fs[] = {single, chunked, lanes};
  const char *nm[] = {"single", "chunked", "lanes"};
  enum { M = 3 };
  for (int rs = 0; rs < 2; rs++) {
    double best[M];
    for (int k = 0; k < M; k++) best[k] = 1e9;
    for (int rep = 0; rep < 11; rep++)
      for (int k = 0; k < M; k++) {
        double t = now();
        fs[k](x, o, rs ? N : 0);
        t = now() - t;
        if (t < best[k]) best[k] = t;
      }
    for (int k = 0; k < M; k++) printf("%s %s %.2f ms\n", rs ? "dram" : "L1", nm[k], best[k] * 1e3);
  }
  return 0;
}
