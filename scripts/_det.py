import torch, kvonce, dataclasses
from kvonce.kernels.configs import get_paged_decode_config
torch.manual_seed(0)
for (hq, hk, b, L, vp) in [(32, 8, 4, 5000, True), (32, 8, 4, 5000, False), (12, 12, 2, 3000, True), (8, 2, 3, 150, True)]:
    pages = b * (-(-L // 16))
    q = torch.randn(b, 1, hq, 128, device="cuda", dtype=torch.float16)
    k = torch.randn(pages, 16, hk, 128, device="cuda", dtype=torch.float16)
    v = torch.randn_like(k)
    table = torch.randperm(pages, device="cuda").reshape(b, -1).to(torch.int32)
    seqlens = torch.full((b,), L, dtype=torch.int32, device="cuda")
    kq, ks = kvonce.quantize_kv(k, "int4"); vq, vs = kvonce.quantize_kv(v, "int4")
    cfg = dataclasses.replace(get_paged_decode_config((9, 0), 128, "int4"), v_pairs=vp)
    for ns in (1, 3):
        pl = kvonce.PagedDecodePlan(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs, kv_format="int4", config=cfg, num_splits=ns)
        outs = [pl.run(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs).clone() for _ in range(30)]
        nd = sum(not torch.equal(outs[0], o) for o in outs)
        ref = kvonce.dequantize_kv(vq, vs, "int4", torch.float32)
        print(hq, hk, b, L, "vpairs", vp, "splits", ns, "nondeterministic runs:", nd, "max diff", max((outs[0]-o).abs().max().item() for o in outs), flush=True)
