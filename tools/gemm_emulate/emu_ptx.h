// Host emulation of gemm.cu's PTX wrappers, following the PTX ISA's definitions:
// - cp.async with a source size of 0 or 16: a copy or a zero fill, at once or as late as its
//   commit group's wait allows (below);
// - ldmatrix .x4: lane l gives the address of row l % 8 of matrix l / 8, and register i of
//   lane t receives elements 2(t % 4), 2(t % 4) + 1 of row t / 4 of matrix i;
// - mma.m16n8k16 .row.col f16 -> f32: with g = t / 4, q = t % 4, A's registers hold
//   (g, 2q), (g + 8, 2q), (g, 2q + 8), (g + 8, 2q + 8) (two halves each), B's (k = 2q, n = g),
//   (k = 2q + 8, n = g), and C's four floats (g, 2q), (g, 2q + 1), (g + 8, 2q), (g + 8, 2q + 1).
// The warp-collective ones exchange through per-warp tables between two warp barriers.
// cp.async in two modes (main runs both): early, a copy at once (a load into a stage some warp
// still reads shows); late, the copies of a commit group at the last wait that must complete
// them (a read before its wait shows).
static bool g_late = false;
struct Copy { void* dst; const void* src; bool valid; };
thread_local std::vector<Copy> t_open;
thread_local std::vector<std::vector<Copy>> t_groups;
static void do_copy(const Copy& c){ if(c.valid) memcpy(c.dst,c.src,16); else memset(c.dst,0,16); }
static void cp_async16(void* dst, const void* src, bool valid){
  if(!g_late) do_copy({dst,src,valid}); else t_open.push_back({dst,src,valid}); }
static void cp_async_commit(){ if(g_late){ t_groups.push_back(t_open); t_open.clear(); } }
template<int N> static void cp_async_wait(){
  while((int)t_groups.size() > N){ for(auto& c : t_groups.front()) do_copy(c); t_groups.erase(t_groups.begin()); } }
static const u16* g_addr[32*8];
static u32 g_frag[32*8][6]; static float g_c[32*8][4];
static void ldmatrix_x4(u32* r, const u16* p){
  int lane=threadIdx.x&31, w=threadIdx.x/32; g_addr[w*32+lane]=p; warp_sync();
  for(int i=0;i<4;i++){ const u16* row=g_addr[w*32+8*i+lane/4]; r[i]=(u32)row[2*(lane%4)] | ((u32)row[2*(lane%4)+1]<<16); }
  warp_sync();
}
static float lo(u32 v){return h2f(v&0xffff);} static float hi(u32 v){return h2f(v>>16);}
static void mma_f16(float* c, const u32* a, u32 b0, u32 b1){
  int lane=threadIdx.x&31, w=threadIdx.x/32; u32* f=g_frag[w*32+lane];
  f[0]=a[0];f[1]=a[1];f[2]=a[2];f[3]=a[3];f[4]=b0;f[5]=b1; warp_sync();
  double A[16][16], B[16][8];
  for(int t=0;t<32;t++){ int g=t/4,q=t%4; u32* x=g_frag[w*32+t];
    A[g][2*q]=lo(x[0]);A[g][2*q+1]=hi(x[0]); A[g+8][2*q]=lo(x[1]);A[g+8][2*q+1]=hi(x[1]);
    A[g][2*q+8]=lo(x[2]);A[g][2*q+9]=hi(x[2]); A[g+8][2*q+8]=lo(x[3]);A[g+8][2*q+9]=hi(x[3]);
    B[2*q][g]=lo(x[4]);B[2*q+1][g]=hi(x[4]); B[2*q+8][g]=lo(x[5]);B[2*q+9][g]=hi(x[5]); }
  int g=lane/4,q=lane%4; int rows[4]={g,g,g+8,g+8}, cols[4]={2*q,2*q+1,2*q,2*q+1};
  for(int e=0;e<4;e++){ double s=0; for(int k=0;k<16;k++) s+=A[rows[e]][k]*B[k][cols[e]]; c[e]+=(float)s; }
  warp_sync();
}
