/* glibc's vector expf (libmvec) on rows of 64 floats, all finite or every other one -inf (the masked
   scores of a causal softmax): the -inf lanes go through its special path, scalar calls per lane.
   ns per row (see docs/performance.md, "The whole long-tail suite under tailjit.jit"):

     gcc -O2 -march=native -mprefer-vector-width=512 -fopenmp -fno-math-errno -fno-trapping-math \
         docs/scripts/vector_expf_inf.c -o /tmp/vector_expf_inf -lmvec -lm
     /tmp/vector_expf_inf; /tmp/vector_expf_inf inf
*/
#include <math.h>
#include <stdio.h>
#include <time.h>
#pragma omp declare simd notinbranch
float expf(float);
static float buf[64], out[64];
int main(int argc, char **argv) {
  const float fill = argc > 1 ? -INFINITY : -3.0f;
  for (int i = 0; i < 64; i++) buf[i] = (i % 2) ? fill : -1.0f * (i % 7);
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  float s = 0;
  for (int r = 0; r < 200000; r++) {
#pragma omp simd
    for (int i = 0; i < 64; i++) out[i] = expf(buf[i]);
    s += out[r & 63];
    buf[0] = -(float)(r & 3);
  }
  clock_gettime(CLOCK_MONOTONIC, &b);
  printf("%s %.1f ns/row (%f)\n", argc > 1 ? "-inf" : "finite",
         ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / 200000, s);
  return 0;
}
