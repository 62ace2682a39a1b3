"""Emulation of tuning linear_rows' accuracy (twenty-third session; CPU, float64 dot products of
e4m3 keys and queries): relative L2 against the float64 relu sum of today's fp32 sum ("cur",
(x + |x|) * w) and of (q_w . k + sum_h w_h |x_h|) / 2 with q_w in 2-4 e4m3 parts ("new"), for four
input draws (q scale 1 / 4, weights randn / uniform positive, keys biased to negative dots).
Output: s23_linear_rows_emulation.log."""
import torch
torch.manual_seed(0)
H,D,T=64,128,8192
f8=torch.float8_e4m3fn
def e4(x): return x.to(f8).to(torch.float64)
for trial,(qs,wdist) in enumerate([(1.0,'randn'),(4.0,'randn'),(1.0,'pos'),(1.0,'neg-bias')]):
    q=e4(torch.randn(H,D,dtype=torch.float64)*qs)
    k=e4(torch.randn(T,D,dtype=torch.float64))
    if trial==3: k=e4(torch.randn(T,D,dtype=torch.float64)-q.mean(0)*0.8)  # mostly negative dots
    w=torch.randn(H,dtype=torch.float64) if wdist!='pos' else torch.rand(H,dtype=torch.float64)
    x=k@q.T  # T,H exact-ish
    ref=(torch.relu(x)*w).sum(1)
    x32=x.float()
    cur=((x32+x32.abs())*w.float()).sum(1).double()/2
    qw=(w[:,None]*q).sum(0)   # D
    for parts in (2,3,4):
        res=qw.clone(); L=torch.zeros(T,dtype=torch.float64)
        for j in range(parts):
            s=res.abs().max()/448
            p=e4(res/s)
            L+= s*(k@p).float().double()
            res=res-s*p
        new=((x32.abs()*w.float()).sum(1).double()+L.float().double())/2
        rl=lambda a:(torch.linalg.vector_norm(a-ref)/torch.linalg.vector_norm(ref)).item()
        print(f"trial {trial} parts {parts}: cur {rl(cur):.2e} new {rl(new):.2e}  frac neg x {(x<0).double().mean():.2f}")
