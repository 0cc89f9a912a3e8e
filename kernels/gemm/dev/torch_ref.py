# dev: cuBLAS (torch.mm) times for the gemm_bf16 suite, NT layout, L2 flushed, median.
import torch
suite=[(64,4096,4096),(128,6144,4096),(128,14336,4096),(128,4096,14336),(256,28672,8192),(512,4096,4096),(1024,8192,8192),(2048,6144,4096),(2048,14336,4096),(2048,4096,14336),(4096,4096,4096),(4096,28672,8192),(8192,8192,8192),(8192,14336,4096),(16384,4096,4096)]
fl=torch.empty(256<<20,dtype=torch.uint8,device='cuda')
for M,N,K in suite:
    a=torch.randn(M,K,device='cuda',dtype=torch.bfloat16); b=torch.randn(N,K,device='cuda',dtype=torch.bfloat16).t()
    for _ in range(3): torch.mm(a,b)
    ts=[]
    for i in range(10 if M*N*K>1e11 else 30):
        fl.fill_(i); e0=torch.cuda.Event(True); e1=torch.cuda.Event(True)
        e0.record(); torch.mm(a,b); e1.record(); torch.cuda.synchronize(); ts.append(e0.elapsed_time(e1)*1000)
    ts.sort(); us=ts[len(ts)//2]
    print(f"TORCH M={M} N={N} K={K}: {us:.1f}us {2*M*N*K/us*1e-6:.0f}TF")
