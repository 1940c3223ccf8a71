"""OpenAI's Videos API over ComfyUI: the jobs, their store on disk, and their thumbnails."""
