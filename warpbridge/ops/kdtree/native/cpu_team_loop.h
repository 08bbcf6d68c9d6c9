
struct wb_team_job {
    void* gomp_parallel;
    void* forward;
    const char* args;
    const char* bounds;
    long long args_size, bounds_size, stride_at, offset_at, size_at;
    long long base, m, chunk, slots, threads, next;
};
auto body = [](void* p) {
    wb_team_job* job = (wb_team_job*)p;
    alignas(16) char args[TEAM_ARGS_MAX];
    alignas(16) char bounds[TEAM_BOUNDS_MAX];
    for (long long i = 0; i < job->args_size; ++i) args[i] = job->args[i];
    for (long long i = 0; i < job->bounds_size; ++i) bounds[i] = job->bounds[i];
    void (*forward)(void*, void*) = (void (*)(void*, void*))job->forward;
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
    }
};
wb_team_job* team_job = (wb_team_job*)job;
((void (*)(void (*)(void*), void*, unsigned, unsigned))team_job->gomp_parallel)(
    body, team_job, (unsigned)team_job->threads, 0u);
