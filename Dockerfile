# gpuflow's image: the control plane (`gpuflow server`) and, on GPU hosts, the agent
# (`gpuflow agent`, run with the NVIDIA container runtime: docker run --gpus all ...).
FROM python:3.11-slim
WORKDIR /opt/gpuflow
COPY pyproject.toml README.md ./
COPY scheduler scheduler
COPY store store
COPY activities activities
COPY workflows workflows
COPY worker_agent worker_agent
COPY hubio hubio
COPY contracts contracts
COPY gateway gateway
COPY console console
COPY views views
COPY gpuflow gpuflow
RUN pip install --no-cache-dir .
ENV GPUFLOW_DATA_DIR=/var/lib/gpuflow
VOLUME /var/lib/gpuflow
ENTRYPOINT ["gpuflow"]
CMD ["server", "--metrics-address", "0.0.0.0:9400"]
