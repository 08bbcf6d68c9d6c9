
struct wb_team_job {
    void* gomp_parallel;
    void* forward;
    const char* args;
    const char* bounds;
    void* clock_gettime;
    long long args_size, bounds_size, stride_at, offset_at, size_at;
    long long base, m, chunk, slots, threads, next, clock_id, chunk_ns;
};
struct wb_timespec { long long s, ns; };
typedef signed (*wb_clock)(signed, wb_timespec*);  // clock_gettime (`int (` would expand Warp's int() macro)
auto body = [](void* p) {
    wb_team_job* job = (wb_team_job*)p;
    alignas(16) char args[TEAM_ARGS_MAX];
    alignas(16) char bounds[TEAM_BOUNDS_MAX];
    for (long long i = 0; i < job->args_size; ++i) args[i] = job->args[i];
    for (long long i = 0; i < job->bounds_size; ++i) bounds[i] = job->bounds[i];
    void (*forward)(void*, void*) = (void (*)(void*, void*))job->forward;
    auto now = [job]() -> long long {
        wb_timespec t;
        ((wb_clock)job->clock_gettime)((signed)job->clock_id, &t);
        return t.s * 1000000000LL + t.ns;
    };
    const long long began = now();
    long long took = 0;
    for (;;) {
        long long s = __atomic_fetch_add(&job->next, 1LL, __ATOMIC_RELAXED);
        long long count, stride, offset;
        if (job->chunk == 0) {
            if (s >= job->slots) break;
            count = s < job->m ? (job->m - s + job->slots - 1) / job->slots : 0;
            stride = job->slots;
            offset = job->base + s;
        } else {
            if (s >= (job->m + job->chunk - 1) / job->chunk) break;
            offset = s * job->chunk;
            count = job->m - offset < job->chunk ? job->m - offset : job->chunk;
            offset += job->base;
            stride = 1;
        }
        if (count == 0) continue;
        *(int*)(args + job->stride_at) = (int)stride;
        *(int*)(args + job->offset_at) = (int)offset;
        *(unsigned int*)bounds = (unsigned int)count;
        *(unsigned long long*)(bounds + job->size_at) = (unsigned long long)count;
        forward(bounds, args);
        ++took;
    }
    if (took) {  // the fastest thread's time per piece of work: what one thread alone would take per piece
        const long long per = (now() - began) / took;
        long long least = __atomic_load_n(&job->chunk_ns, __ATOMIC_RELAXED);
        while (per < least && !__atomic_compare_exchange_n(&job->chunk_ns, &least, per, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    }
};
wb_team_job* team_job = (wb_team_job*)job;
((void (*)(void (*)(void*), void*, unsigned, unsigned))team_job->gomp_parallel)(
    body, team_job, (unsigned)team_job->threads, 0u);
