// Peak multiply-accumulate throughput of one x86_64 core, fp32 vs int8, in inline asm so the
// compiler cannot fold it.  Why int8 is (or is not) faster than fp32 on a CPU starts here.
//   gcc -O2 tools/peak_macs.c -o /tmp/peak_macs && /tmp/peak_macs
// Run it a few times on a busy machine; the ratios are the numbers to read.
// fp32 FMA (8 MACs per ymm instruction) vs AVX2 int8 u8*s8 without VNNI:
// vpmaddubsw (32 u8*s8 -> 16 int16 pair sums) + vpmaddwd with ones (-> 8 int32) + vpaddd,
// the sequence ONNX Runtime's MLAS and oneDNN use on CPUs without AVX-VNNI.
// 12 FMA accumulators: enough independent chains to cover FMA latency on current x86 cores.
#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(){
  long n=50000000; double t0,t;
  t0=now();
  for(long i=0;i<n;i++) __asm__ volatile(
    "vfmadd231ps %%ymm14,%%ymm15,%%ymm0\n vfmadd231ps %%ymm14,%%ymm15,%%ymm1\n vfmadd231ps %%ymm14,%%ymm15,%%ymm2\n vfmadd231ps %%ymm14,%%ymm15,%%ymm3\n"
    "vfmadd231ps %%ymm14,%%ymm15,%%ymm4\n vfmadd231ps %%ymm14,%%ymm15,%%ymm5\n vfmadd231ps %%ymm14,%%ymm15,%%ymm6\n vfmadd231ps %%ymm14,%%ymm15,%%ymm7\n"
    "vfmadd231ps %%ymm14,%%ymm15,%%ymm8\n vfmadd231ps %%ymm14,%%ymm15,%%ymm9\n vfmadd231ps %%ymm14,%%ymm15,%%ymm10\n vfmadd231ps %%ymm14,%%ymm15,%%ymm11\n"
    ::: "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11");
  t=now()-t0; double fp=n*12*8/t/1e9;
  printf("fp32 vfmadd231ps ymm:        %5.1f GMAC/s per core\n", fp);
  t0=now();
  for(long i=0;i<n;i++) __asm__ volatile(
    "vpmaddubsw %%ymm14,%%ymm15,%%ymm8\n vpmaddwd %%ymm13,%%ymm8,%%ymm8\n vpaddd %%ymm8,%%ymm0,%%ymm0\n"
    "vpmaddubsw %%ymm14,%%ymm15,%%ymm9\n vpmaddwd %%ymm13,%%ymm9,%%ymm9\n vpaddd %%ymm9,%%ymm1,%%ymm1\n"
    "vpmaddubsw %%ymm14,%%ymm15,%%ymm10\n vpmaddwd %%ymm13,%%ymm10,%%ymm10\n vpaddd %%ymm10,%%ymm2,%%ymm2\n"
    "vpmaddubsw %%ymm14,%%ymm15,%%ymm11\n vpmaddwd %%ymm13,%%ymm11,%%ymm11\n vpaddd %%ymm11,%%ymm3,%%ymm3\n"
    ::: "xmm0","xmm1","xmm2","xmm3","xmm8","xmm9","xmm10","xmm11");
  t=now()-t0; double q=n*4*32/t/1e9;
  printf("int8 vpmaddubsw+vpmaddwd+vpaddd: %5.1f GMAC/s per core\n", q);
  t0=now();
  for(long i=0;i<n;i++) __asm__ volatile(
    "vpmaddwd %%ymm14,%%ymm15,%%ymm8\n vpaddd %%ymm8,%%ymm0,%%ymm0\n vpmaddwd %%ymm14,%%ymm15,%%ymm9\n vpaddd %%ymm9,%%ymm1,%%ymm1\n"
    "vpmaddwd %%ymm14,%%ymm15,%%ymm10\n vpaddd %%ymm10,%%ymm2,%%ymm2\n vpmaddwd %%ymm14,%%ymm15,%%ymm11\n vpaddd %%ymm11,%%ymm3,%%ymm3\n"
    ::: "xmm0","xmm1","xmm2","xmm3","xmm8","xmm9","xmm10","xmm11");
  t=now()-t0; double w=n*4*16/t/1e9;
  printf("int16 vpmaddwd+vpaddd (u8u8 path): %5.1f GMAC/s per core\n", w);
  printf("int8/fp32 = %.2f, int16/fp32 = %.2f\n", q/fp, w/fp);
  return 0;}
